"""One host's data -> its :class:`NodeConfig`, or every problem with it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from deploys.schema.control_files import control_file_problems
from deploys.schema.monitoring import MonitoringHostConfig
from deploys.schema.node import NodeConfig
from deploys.schema.problems import MISSING, PYINFRA_KEYS, Problem, problems_from
from deploys.unit_text import unprintable


UNPRINTABLE = ("no control characters (newline, tab, NUL, escape, zero-width or bidi marks): unit and env files "
               "cannot carry them safely")


def schema_data(data: dict[str, Any]) -> dict[str, Any]:
    """The part of a host's data the schema owns (pyinfra's own connector/argument keys dropped)."""
    return {k: v for k, v in data.items() if k not in PYINFRA_KEYS}


def _strings(value: Any):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def parse_node(host: str, data: dict[str, Any]) -> tuple[NodeConfig | None, list[Problem]]:
    """Validate one host's data: keys holding an unprintable character are reported once (and never echoed
    raw elsewhere) while the others are still checked; the control-node files it names are checked once
    its keys parse. A key the profile lists in `profile_gaps` that is still unset is reported as the
    write-up's gap."""
    cfg, problems = _parse_node(host, schema_data(data))
    return cfg, _as_gaps(host, data.get("profile_gaps"), problems)


def _as_gaps(host: str, gaps: Any, problems: list[Problem]) -> list[Problem]:
    if not isinstance(gaps, dict):
        return problems
    return [
        Problem(host, p.key, MISSING, f"a value: the profile's write-up stops here ({gaps[p.key]}) and the "
                "toolkit does not invent one; set it in the inventory to what you verified", gap=True)
        if p.key in gaps and isinstance(gaps[p.key], str) and (p.value is MISSING or p.value is None) else p
        for p in problems
    ]


def parse_monitoring_host(host: str, data: dict[str, Any], asked: set[str]) -> tuple[MonitoringHostConfig | None, list[Problem]]:
    """Validate a monitoring-only host's data (deploys/schema/cross_host.py monitoring_host_data): ``asked``, the keys
    its own entry or the group `monitoring` sets, must be keys of a monitoring host; keys of the groups every host
    is in (defaults for the lab's inference nodes) are read only where they are such keys."""
    data = schema_data(data)
    wrong = [Problem(host, key, data[key], "no key of a monitoring-only host (in the group `monitoring` and no "
                     "serving cluster's: it runs Prometheus and Alertmanager only; give it a cluster_name to make it "
                     "an inference node too)")
             for key in sorted(asked) if key in data and key in NodeConfig.model_fields
             and key not in MonitoringHostConfig.model_fields]
    wrong_keys = {p.key for p in wrong}
    kept = {k: v for k, v in data.items()
            if k not in wrong_keys and (k in MonitoringHostConfig.model_fields or k in asked)}
    cfg, problems = _parse_node(host, kept, MonitoringHostConfig)
    return (None if wrong else cfg), wrong + problems


def _parse_node(host: str, data: dict[str, Any], model: type = NodeConfig):
    """The config, or None when a key is wrong; a host whose keys are right but whose control-node files are not
    keeps its config beside those problems (a run limited to other hosts may leave it out: deploys/schema/cross_host.py)."""
    unprintable_keys = [key for key, value in data.items() if any(unprintable(s) for s in _strings(value))]
    problems = [Problem(host, key, data[key], UNPRINTABLE) for key in unprintable_keys]
    rest = {k: v for k, v in data.items() if k not in unprintable_keys}
    try:
        cfg = model.model_validate(rest)
    except ValidationError as e:
        # a required key held back above is "missing" in `rest`: it is already reported
        return None, problems + [p for p in problems_from(host, rest, e, model, PYINFRA_KEYS)
                                 if p.key.split("[", 1)[0] not in unprintable_keys]
    if problems:
        return None, problems
    return cfg, [replace(p, control_file=True) for p in control_file_problems(host, cfg)]

"""Problems that name host, key, value and expectation; pydantic's errors translated into them; and
showing a bad value without ever showing a secret."""

from __future__ import annotations

import difflib
import functools
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from pyinfra.api.exceptions import DeployError

from deploys.schema.base import CONTROL_FILE, CONTROL_SECRET, SECRET_NAME, KeyRuleError, is_safe_path, path_kind
from deploys.schema.node import NodeConfig
from deploys.schema.secret_shapes import HIDDEN, URL_CREDENTIALS, looks_secret

# --------------------------------------------------------------------------------------------------
# Showing a bad value without ever showing a secret

def _pyinfra_keys() -> frozenset[str]:
    """pyinfra's own host-data keys: every installed connector's data keys and the global arguments
    (`_sudo`, ...). host.data carries them beside ours; everything else must be a schema key, so a typo
    (`podman_min_versoin`) is an error, not a silently ignored value."""
    from importlib.metadata import entry_points

    from pyinfra.api.arguments import all_global_arguments

    keys = {name for name, _ in all_global_arguments() if name.startswith("_")}
    for ep in entry_points(group="pyinfra.connectors"):
        try:
            keys |= set(getattr(ep.load(), "data_meta", None) or {})
        except Exception:  # a broken third-party connector must not break validation
            continue
    return frozenset(keys)


PYINFRA_KEYS = _pyinfra_keys()


@functools.cache
def control_file_keys() -> frozenset[str]:
    """The keys whose value is a control-node file (their type is ``ControlSecret`` or ``ControlFile``): a value
    that is not a path may be the file's content pasted in (client keys, a webhook URL, a PEM block)."""
    return frozenset(k for k, f in NodeConfig.model_fields.items()
                     if path_kind(f.annotation) in (CONTROL_SECRET, CONTROL_FILE))


@functools.cache
def _known_keys() -> frozenset[str]:
    return frozenset(NodeConfig.model_fields) | PYINFRA_KEYS


def shown_value(key: str, value: Any) -> str:
    """``value`` as an error message may show it: secrets (by the key's name, by their shape, a control-file
    key given something that is not a path, any text under a key the schema does not know: a misspelled
    `alertmanager_webhok_url_file` may hold the URL itself) are replaced by a placeholder."""
    base = key.split("[", 1)[0]
    if base in control_file_keys() and value is not None and not (isinstance(value, str) and is_safe_path(value)):
        return "<hidden: not a path; the key takes a control-node file, whose content is never shown>"
    if base not in control_file_keys() and SECRET_NAME.fullmatch(base):
        return "<hidden: the key is named like a secret>"
    if not base.startswith("(") and base not in _known_keys() and not _plain_scalar(value):
        return "<hidden: the value of an unknown key is never shown>"
    return repr(_redacted(value))


def _plain_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float))


class _Hidden(str):
    def __repr__(self) -> str:
        return HIDDEN


def _redacted(value: Any) -> Any:
    if isinstance(value, str):
        return _Hidden() if looks_secret(value) else URL_CREDENTIALS.sub(r"\1<hidden>@", value)
    if isinstance(value, dict):
        return {k: (_Hidden() if SECRET_NAME.fullmatch(str(k)) else _redacted(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_redacted(v) for v in value)
    return value


# --------------------------------------------------------------------------------------------------
# Errors that name host, key, value and expectation

MISSING = object()  # the value of a required key that is not set


@dataclass(frozen=True)
class Problem:
    host: str
    key: str
    value: Any
    expected: str
    gap: bool = False  # a value the profile's write-up leaves open (profile_gaps), not a wrong one
    control_file: bool = False  # a control-node file the key names (deploys/schema/control_files.py), not its value

    def __str__(self) -> str:
        shown = "<missing>" if self.value is MISSING else shown_value(self.key, self.value)
        return f"host {self.host}: key '{self.key}' = {shown}: expected {self.expected}"


class InventoryValidationError(DeployError):
    """The inventory is invalid; nothing was changed on any host."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        hint = ""
        if any(p.gap for p in problems):
            hint = ("\n  (profile gaps: until they are set, deploy the other groups with pyinfra's --limit; a host "
                    "outside the limit whose only problems are gaps is left out)")
        super().__init__(
            f"inventory validation failed ({len(problems)} problem(s)); nothing was changed on any host:\n{lines}{hint}"
        )


# --------------------------------------------------------------------------------------------------
# pydantic's errors, as sentences that name the key


def problems_from(host: str, data: dict[str, Any], error: ValidationError, model: type[BaseModel],
                  other_keys: typing.Iterable[str] = ()) -> list[Problem]:
    """``error`` (from validating ``data`` as ``model``) as one problem per bad key. ``other_keys``: keys
    that are not the model's but are known (pyinfra's own), offered as spellings of an unknown key."""
    out: list[Problem] = []
    union_expected: dict[str, list[str]] = {}
    for err in error.errors():
        ctx_err = (err.get("ctx") or {}).get("error")
        if isinstance(ctx_err, KeyRuleError):
            out.append(Problem(host, ctx_err.key, ctx_err.value, ctx_err.expected))
            continue
        loc = [str(p) for p in err["loc"]]
        key = loc[0] if loc else "?"
        if err["type"] == "missing":
            out.append(Problem(host, key, MISSING, f"a value ({_describe(model, key)})"))
        elif err["type"] == "extra_forbidden" and len(loc) == 1:
            out.append(Problem(host, key, data.get(key), _unknown_key(key, [*model.model_fields, *other_keys])))
        elif len(loc) >= 2 and _union_field(model, key) and not loc[1].isdigit():
            # one error per member of the union (loc names the member's type): one problem for the key
            union_expected.setdefault(key, []).append(_expected_from(err))
        else:
            where = key + "".join(f"[{p}]" for p in loc[1:])
            expected = "no such field: a typo?" if err["type"] == "extra_forbidden" else _expected_from(err)
            if err["type"] == "string_pattern_mismatch":
                expected += f" ({_describe(model, key)})"
            out.append(Problem(host, where, err.get("input"), expected))
    for key, alternatives in union_expected.items():
        out.append(Problem(host, key, data.get(key), " or ".join(dict.fromkeys(alternatives))))
    return out


def _expected_from(err: dict) -> str:
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "string_pattern_mismatch":
        return f"a value matching {err['ctx']['pattern']}"
    for prefix in ("Input should be ", "String should have ", "String should be ", "List should have ",
                   "Dictionary should have ", "expected "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
            break
    if msg.startswith(("greater than", "less than")):
        msg = f"a number {msg}"
    elif msg.startswith(("at least", "at most")):
        msg = f"a value with {msg}"
    return msg.replace("a finite number", "a finite number (not inf or nan)")


def _union_field(model: type[BaseModel], key: str) -> bool:
    field = model.model_fields.get(key)
    return field is not None and typing.get_origin(field.annotation) in (typing.Union, types.UnionType)


def _unknown_key(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    hint = f"did you mean '{close[0]}'?" if close else "a typo?"
    return f"no such key ({hint} see docs/inventory-keys.md; pyinfra's own keys are its connectors' and global arguments')"


def _describe(model: type[BaseModel], key: str) -> str:
    field = model.model_fields.get(key)
    return field.description if field and field.description else key

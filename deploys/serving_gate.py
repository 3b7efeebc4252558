"""The control side's handle on the serving gate (files/serving_gate/serving_gate.py: stdlib only, uploaded
to a head and run there, since the API stays on loopback): its path, the options a node's profile gives it
(GateKeys), the order a cluster restarts in, where its startup log is read, the command that runs it on a
head together with the modules it imports (``node_script``), and the gate's own functions for code that runs
here (``wait_ready``: the one /health wait of the audits, the node tests and the benchmarks).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shlex
from types import ModuleType

from deploys.schema import NodeConfig

GATE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "files", "serving_gate")
GATE = os.path.join(GATE_DIR, "serving_gate.py")
GATE_FILES = ("schema_subset.py", "serving_gate.py")  # the gate and what it imports from beside it


@functools.cache
def gate_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("serving_gate", GATE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def wait_ready(base: str, timeout: float, interval: float = 2.0) -> float:
    """Seconds until BASE/health answers 200; TimeoutError (naming the URL and last answer) after ``timeout``."""
    return gate_module().wait_ready(base, timeout, interval)


def node_script(run: str, names: tuple[str, ...] = GATE_FILES) -> str:
    """A command for a head: ``names`` (files/serving_gate/) written into a private temporary directory
    ``$d``, removed on exit, then the shell lines ``run`` (which run them from there, e.g. ``"$d/serving_gate.py"``)."""
    files = []
    for name in names:
        with open(os.path.join(GATE_DIR, name)) as f:
            files.append(f"cat > \"$d/{name}\" <<'GATE_EOF'\n{f.read()}\nGATE_EOF\n")
    return "sh <<'GATE_SH'\nd=$(mktemp -d); trap 'rm -rf \"$d\"' EXIT\n" + "".join(files) + run + "GATE_SH"


def api_url(cfg: NodeConfig) -> str:
    return f"http://{cfg.api_bind_address}:{cfg.api_port}"


def gate_options(cfg: NodeConfig) -> list[str]:
    """The gate's command-line options for the qualification checks the profile selects."""
    if not cfg.gate_concurrency:
        return []
    out = ["--concurrency", str(cfg.gate_concurrency), "--concurrency-tokens", str(cfg.gate_concurrency_tokens)]
    if cfg.gate_min_aggregate_tok_s:
        out += ["--min-aggregate-tok-s", f"{cfg.gate_min_aggregate_tok_s:g}"]
    return out


def restart_order(members: list[tuple[str, NodeConfig]]) -> list[tuple[str, NodeConfig]]:
    """A cluster's nodes in the order they (re)start: workers (rank > 0) before the head, as the deploy does
    (deploys/inference_service.py: a head cannot take a new worker into a running job)."""
    return sorted(members, key=lambda m: m[1].node_rank == 0)


def startup_log_command(cfg: NodeConfig) -> str:
    """Shell command printing the service's journal since its current start (its startup log: the KV figures),
    so a figure from an earlier start never stands in for the running one."""
    service = shlex.quote(f"{cfg.container_name}.service")
    return (f"since=$(systemctl show --timestamp=us+utc -p ExecMainStartTimestamp --value {service}) && "
            f"[ -n \"$since\" ] && journalctl -u {service} --no-pager -o cat --since \"$since\"")

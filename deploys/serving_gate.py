"""The control side's handle on the serving gate (files/serving_gate/serving_gate.py: stdlib only, uploaded
to a head and run there, since the API stays on loopback): its path, the options a node's profile gives it
(GateKeys), the order a cluster restarts in, where its startup log is read, the command that runs it on a
head together with the modules it imports (``node_script``), and the gate's own functions for code that runs
here (``wait_ready``: the one /health wait of the node tests and the benchmarks), and the one wait for a
(re)started service that the converge and the audit share (``wait_serving``: it reads the unit's own state,
so a unit that failed or restarts fails at once, with its journal, instead of waiting out the bound).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import shlex
import time
from typing import Callable
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


def engine_url(cfg: NodeConfig) -> str:
    """vLLM itself (its own port, not what fronts it): where the gate, the drain and the readiness wait ask."""
    host = f"[{cfg.engine_address}]" if ":" in cfg.engine_address else cfg.engine_address
    return f"http://{host}:{cfg.engine_port}"


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
    (deploys/service/unit.py: a head cannot take a new worker into a running job)."""
    return sorted(members, key=lambda m: m[1].node_rank == 0)


def startup_log_command(cfg: NodeConfig) -> str:
    """Shell command printing the service's journal since its current start (its startup log: the KV figures),
    so a figure from an earlier start never stands in for the running one."""
    service = shlex.quote(f"{cfg.container_name}.service")
    return (f"since=$(systemctl show --timestamp=us+utc -p ExecMainStartTimestamp --value {service}) && "
            f"[ -n \"$since\" ] && journalctl -u {service} --no-pager -o cat --since \"$since\"")


def gate_command(cfg: NodeConfig, model: str, *options: str) -> str:
    """The serving gate run on a head against its loopback API: one JSON check per line on stdout."""
    return node_script(f"python3 \"$d/serving_gate.py\" {shlex.join([engine_url(cfg), model, *options])}\n")


def gate_checks(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def failed_checks(checks: list[dict]) -> list[str]:
    """``check: detail`` of each failed check; one line saying so when the gate printed none."""
    if not checks:
        return ["the gate printed no verdict"]
    return [f"{c['check']}: {c['detail']}" for c in checks if not c["ok"]]


# The service's own startup stages, as vLLM logs them (the last line that names one is where it is).
STAGES = (
    ("loading weights", re.compile(r"Loading (safetensors|weights|model)|Loading .*checkpoint|Model loading took", re.I)),
    ("compiling", re.compile(r"torch\.compile|Compiling a graph|compil(ing|ation)", re.I)),
    ("allocating the KV cache", re.compile(r"KV cache|num_gpu_blocks|Maximum concurrency", re.I)),
    ("capturing graphs", re.compile(r"Capturing (CUDA )?graphs|cudagraph", re.I)),
    ("waiting for the other nodes", re.compile(r"world_size=|Waiting for|rendezvous", re.I)),
    ("starting the API server", re.compile(r"Starting vLLM API server|Available routes|Uvicorn running|"
                                           r"Application startup", re.I)),
)
_READ_MARK = "##inference-nodes-readiness:"
JOURNAL_LINES = 200  # read at each look (a crash's reason before its restart noise); a failure shows the last 15


def readiness_command(cfg: NodeConfig, head: bool) -> str:
    """One round trip: the unit's state, the head's /health answer (status code, 0: none), the journal since the
    current start. Read-only."""
    service = shlex.quote(f"{cfg.container_name}.service")
    health = (f"python3 -c 'import sys, urllib.request as u\ntry: print(u.urlopen(sys.argv[1], timeout=5).status)"
              f"\nexcept Exception as e: print(getattr(e, \"code\", 0))' {shlex.quote(engine_url(cfg) + '/health')}"
              if head else "echo 0")
    return (f"systemctl show -p ActiveState -p SubState -p NRestarts -p InvocationID -p Result {service}; "
            f"echo '{_READ_MARK}health'; {health}; echo '{_READ_MARK}journal'; "
            f"since=$(systemctl show --timestamp=us+utc -p ExecMainStartTimestamp --value {service}); "
            f"[ -n \"$since\" ] && journalctl -u {service} --no-pager -o cat -n {JOURNAL_LINES} --since \"$since\"; true")


def parse_readiness(output: str) -> dict:
    """``readiness_command``'s output: the unit's properties, ``health`` (an HTTP status, 0: no answer) and
    ``journal`` (lines)."""
    part, props, health, journal = "props", {}, 0, []
    for line in output.splitlines():
        if line.startswith(_READ_MARK):
            part = line[len(_READ_MARK):].strip()
        elif part == "props" and "=" in line:
            key, value = line.split("=", 1)
            props[key.strip()] = value.strip()
        elif part == "health" and line.strip().isdigit():
            health = int(line.strip())
        elif part == "journal":
            journal.append(line)
    return {**props, "health": health, "journal": journal}


def startup_stage(journal: list[str], multi_node: bool = True) -> str:
    """Where a starting service is, from the last journal line that names a stage ('' when none does). A single
    node never waits for other nodes (its torch rendezvous lines are its own processes)."""
    for line in reversed(journal):
        for stage, pattern in STAGES:
            if pattern.search(line) and (multi_node or stage != "waiting for the other nodes"):
                return stage
    return ""


# The service's own error lines, most telling first: vLLM's ERROR level (its log lines start with the level), an
# exception's closing line (`ValueError: ...` after a traceback), the container's exit; then any line that names an
# error, unless it is a warning (`WARNING ... error` of a ulimit or a deprecation is not why a start failed).
_ERROR_LINES = (
    re.compile(r"^\s*(\(\S+ pid=\d+\)\s*)?ERROR\b"),
    re.compile(r"^\s*([A-Za-z_][\w.]*\.)?[A-Z]\w*(Error|Exception)(: |$)"),
    re.compile(r"Traceback \(most recent call last\)|exited with (code|status) [1-9]|status=[1-9]\d*/|Main process "
               r"exited, code=(exited|killed|dumped), status=[1-9]"),
)
ERROR_LINE = re.compile(r"\b\w*(Error|Exception)\b|\berror:|Input should be", re.I)
_WARNING = re.compile(r"^\s*(\(\S+ pid=\d+\)\s*)?(WARNING|WARN|INFO|DEBUG)\b|\bwarning\b", re.I)


def first_error(journal: list[str]) -> str | None:
    """The line that says why the service failed: the first of the most telling kind (see _ERROR_LINES)."""
    for pattern in (*_ERROR_LINES, ERROR_LINE):
        found = next((line for line in journal if pattern.search(line) and not _WARNING.search(line)), None)
        if found:
            return found
    return None


def journal_told(journal: list[str], lines: int = 15) -> str:
    """The end of a service's journal for a failure message, led by its first error line when that scrolled off
    (a crash's reason comes before the restart noise); one journal line per line, blank lines dropped."""
    journal = [line.rstrip() for line in journal if line.strip()]
    tail = journal[-lines:]
    first = first_error(journal)
    lead = f"; first error: {first.strip()[:400]}" if first and first not in tail else ""
    return f"{lead}; its journal ends:\n" + "\n".join(tail) if journal else f"{lead}; its journal is empty"


def _restarts(read: dict) -> int:
    try:
        return int(read.get("NRestarts", ""))
    except ValueError:
        return 0


def readiness_verdict(now: dict, first: dict, head: bool) -> tuple[str, str]:
    """("ready" | "wait" | "failed", why) for a service read ``now``, ``first`` being the first read of this wait.
    A head is ready when its unit is active and /health answers 200, a worker when its unit runs. A unit that is
    inactive, failed or waiting to be restarted fails at once, as does one that restarted since the first read
    (its invocation moved or its start count grew): systemd's own restarts would otherwise hide a crash loop. A
    count that went down is no restart: the node's backoff reset (`systemctl reset-failed`) zeroes it while the
    unit runs, and a manual restart keeps it."""
    active, sub = now.get("ActiveState", "?"), now.get("SubState", "?")
    state = f"{active} ({sub})"
    if active == "active" and (now["health"] == 200 if head else sub == "running"):
        return "ready", state
    if active in ("failed", "inactive") or sub == "auto-restart":
        result = now.get("Result", "")
        return "failed", f"the unit is {state}" + (f", result {result}" if result not in ("", "success") else "")
    if _restarts(now) > _restarts(first) or now.get("InvocationID") != first.get("InvocationID"):
        return "failed", (f"the unit restarted while starting (restarts {first.get('NRestarts')} -> "
                          f"{now.get('NRestarts')}, now {state})")
    return "wait", state + (f", /health {now['health']}" if head and now["health"] else "")


def wait_serving(run: Callable[[str], str], cfg: NodeConfig, head: bool, timeout: float,
                 progress: Callable[[str], None] | None = None, interval: float = 2.0,
                 every: float = 30.0, abort: Callable[[], str | None] | None = None,
                 tick: Callable[[], None] | None = None) -> tuple[bool, str, dict]:
    """Wait until the service of ``cfg`` is ready (``readiness_verdict``), at most ``timeout`` seconds.
    ``run(command) -> stdout`` runs a command on the node; ``progress(line)`` hears the elapsed time and the
    service's stage when it changes and every ``every`` seconds; ``tick()`` is called at each read. Returns (ready, why, the last read); a failure's
    ``why`` ends with the last journal lines."""
    t0 = time.monotonic()
    first = None
    told, told_at = None, 0.0
    while True:
        now = parse_readiness(run(readiness_command(cfg, head)))
        first = first or now
        verdict, why = readiness_verdict(now, first, head)
        elapsed = time.monotonic() - t0
        service = f"{cfg.container_name}.service"
        if verdict == "ready":
            return True, f"{service} {'answers /health' if head else 'runs'} after {elapsed:.0f} s", now
        if verdict == "failed":
            return False, f"{service}: {why}{journal_told(now['journal'])}", now
        if tick:
            tick()
        if abort and (why_not := abort()):
            return False, f"{service}: {why_not}{journal_told(now['journal'])}", now
        if elapsed >= timeout:
            return False, (f"{service} did not answer /health within service_ready_timeout_sec={timeout:g} s "
                           f"({why}){journal_told(now['journal'])}"), now
        stage = startup_stage(now["journal"], cfg.tensor_parallel_size > len(cfg.gpu_indices))
        if progress and (stage != told or elapsed - told_at >= every):
            progress(f"waiting for {service}: {elapsed:.0f} s, {why}" + (f", {stage}" if stage else ""))
            told, told_at = stage, elapsed
        time.sleep(interval)

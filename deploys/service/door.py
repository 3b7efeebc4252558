"""The door: a head whose service is about to restart closes its endpoint to new requests and lets the requests in
flight finish; the switch marker tells the node's metrics the restart is planned work, within its own bound."""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api import QuoteString, StringCommand

from deploys.endpoint import RETRY_AFTER_S, RETRY_AFTER_STEPS, closed_flag_path, retry_hint_path, retry_hint_paths
from deploys.ops import sudo_args, until_marker_command
from deploys.run.reads import run_on
from deploys.schema import NodeConfig
from deploys.serving_gate import engine_url

# Waits for a head's requests in flight to finish (its vLLM's own gauge, summed over models), at most BOUND seconds;
# prints how many still run then.
# Counts the requests vLLM holds (running and waiting, summed over models) from a short grace after the door closed
# (a request admitted just before it reaches vLLM's counts), until none is left or BOUND seconds passed; a read that
# fails is not a zero: it is read again, and said as `?` if none succeeded by the bound. Prints: left, seconds.
DRAIN = ("import sys, time, urllib.request as u\n"
         "url, bound, t0 = sys.argv[1], float(sys.argv[2]), time.monotonic()\n"
         "time.sleep(min(1.0, bound))\n"
         "held = ('vllm:num_requests_running', 'vllm:num_requests_waiting')\n"
         "while True:\n"
         "    try:\n"
         "        text = u.urlopen(url, timeout=5).read().decode()\n"
         "        n = sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(held))\n"
         "    except Exception:\n"
         "        n = None\n"
         "    if (n is not None and n <= 0) or time.monotonic() - t0 >= bound:\n"
         "        print('?' if n is None else int(n), round(time.monotonic() - t0))\n"
         "        break\n"
         "    time.sleep(1)\n")


def drain(state, host, cfg: NodeConfig) -> bool:
    ok, out = run_on(host, StringCommand("python3", "-c", QuoteString(DRAIN), f"{engine_url(cfg)}/metrics",
                                         str(cfg.endpoint_drain_s)), **sudo_args(host))
    left, waited = (out.stdout.split() + ["?", "?"])[:2] if ok else ("?", "?")
    host.log_styled("closed the door to new requests (JSON 503, Retry-After); " + drain_told(left, waited, cfg),
                    log_func=logger.info)
    return True



def drain_told(left: str, waited: str, cfg: NodeConfig) -> str:
    """What the drain's answer (``DRAIN``'s output) means, in words."""
    if left == "0":
        return f"requests in flight finished after {waited} s" if waited not in ("0", "1") else "no request in flight"
    if left == "?":
        return (f"vLLM's request counts could not be read for endpoint_drain_s={cfg.endpoint_drain_s} s: the restart "
                "may cut requests in flight")
    return f"{left} request(s) still in flight after endpoint_drain_s={cfg.endpoint_drain_s} s: the restart cuts them"


def switch_marker_path(cfg: NodeConfig) -> str:
    """Written on a node before a converge (re)starts its service, removed once the switch ended (gated, rolled back
    or failed): planned work, which the service-down and closed-endpoint alerts do not page for
    (files/monitoring/node_facts.py). It holds its own bound, `service_switch_lease_s` from its last renewal (the
    converge renews it while it waits), so a killed converge's marker stops counting by itself within minutes."""
    return f"/var/lib/inference-nodes/{cfg.container_name}.switching.json"


def switch_marker_command(cfg: NodeConfig, longer_s: int = 0) -> str:
    """Shell: write (or renew) the switch marker, counting `service_switch_lease_s` plus ``longer_s`` from now (a step
    that cannot renew it while it runs, a drain or a gate, asks for its own bound on top)."""
    return until_marker_command(switch_marker_path(cfg), cfg.service_switch_lease_s + longer_s)


def retry_after_s(expected_s, elapsed_s: float) -> int:
    """What a closed door tells its clients to wait (`Retry-After`): how long this switch may still take, judged by
    how long the head's last switch kept its door closed (``expected_s``, in its gate record) less what this one has
    taken so far, rounded up to a step of ``RETRY_AFTER_STEPS`` and at most 60 s (the door tells again then);
    ``RETRY_AFTER_S`` where it cannot say: no switch timed before, or this one already ran longer."""
    if not isinstance(expected_s, (int, float)) or expected_s <= 0 or elapsed_s >= expected_s:
        return RETRY_AFTER_S
    left = expected_s - elapsed_s
    return next((s for s in RETRY_AFTER_STEPS if s >= left), RETRY_AFTER_STEPS[-1])


def door_tells_command(cfg: NodeConfig, seconds: int) -> str:
    """Shell: the closed door's `Retry-After` hint set to ``seconds`` (one of ``RETRY_AFTER_STEPS``): the new hint
    is in place before the others go, so nginx never reads none in between."""
    others = [p for p in retry_hint_paths(cfg) if p != retry_hint_path(cfg, seconds)]
    return f"touch {retry_hint_path(cfg, seconds)} && rm -f {' '.join(others)}"


def door_open_command(cfg: NodeConfig) -> str:
    """Shell: the door opens (its closed flag and its `Retry-After` hint go)."""
    return f"rm -f {closed_flag_path(cfg)} {' '.join(retry_hint_paths(cfg))}"


def door_close_command(cfg: NodeConfig, expected_s) -> str:
    """Shell: the door closes, telling its clients how long the switch may take (``retry_after_s``). The flag holds
    ``expected_s``, how long the head's last switch kept the door closed (its gate record goes at the restart), and
    its mtime says when this switch closed it: what the converge's wait reads (``door_closed_at_command``)."""
    expected = str(round(expected_s)) if isinstance(expected_s, (int, float)) and expected_s > 0 else ""
    return (f"{door_tells_command(cfg, retry_after_s(expected_s, 0))} && "
            f"printf '%s\\n' '{expected}' > {closed_flag_path(cfg)}")


def door_closed_at_command(cfg: NodeConfig) -> str:
    """Shell: when the door closed, what its last switch took, and the node's clock now (``parse_door_closed``)."""
    flag = closed_flag_path(cfg)
    return f"if [ -f {flag} ]; then stat -c %Y {flag}; head -c 32 {flag} | tr -d '\\n'; echo; fi; date +%s"


def parse_door_closed(out: str) -> tuple[float | None, float | None]:
    """(how long the door has been closed, how long the last switch kept it closed) from
    ``door_closed_at_command``'s output; None where the door is open, or the figure is unreadable."""
    lines = [line.strip() for line in out.strip().splitlines()]
    if len(lines) != 3:
        return None, None
    try:
        closed_s = max(0.0, float(lines[2]) - float(lines[0]))
    except ValueError:
        return None, None
    try:
        expected = float(lines[1]) if lines[1] else None
    except ValueError:
        expected = None
    return closed_s, expected

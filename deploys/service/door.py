"""The door: a head whose service is about to restart closes its endpoint to new requests and lets the requests in
flight finish; the switch marker tells the node's metrics the restart is planned work, within its own bound."""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api import QuoteString, StringCommand

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

"""The door: a head whose service is about to restart closes its endpoint to new requests and lets the requests in
flight finish; the switch marker tells the node's metrics the restart is planned work, within its own bound."""

from __future__ import annotations

import posixpath

from pyinfra import logger
from pyinfra.api import QuoteString, StringCommand

from deploys.ops import uses_sudo
from deploys.run.reads import run_on
from deploys.schema import NodeConfig
from deploys.serving_gate import api_url

# Waits for a head's requests in flight to finish (its vLLM's own gauge, summed over models), at most BOUND seconds;
# prints how many still run then.
DRAIN = ("import sys, time, urllib.request as u\n"
         "url, bound, t0 = sys.argv[1], float(sys.argv[2]), time.monotonic()\n"
         "while True:\n"
         "    try:\n"
         "        text = u.urlopen(url, timeout=5).read().decode()\n"
         "        n = sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith('vllm:num_requests_running'))\n"
         "    except Exception:\n"
         "        n = 0\n"
         "    if n <= 0 or time.monotonic() - t0 >= bound:\n"
         "        print(int(n), round(time.monotonic() - t0))\n"
         "        break\n"
         "    time.sleep(1)\n")


def drain(state, host, cfg: NodeConfig) -> bool:
    ok, out = run_on(host, StringCommand("python3", "-c", QuoteString(DRAIN), f"{api_url(cfg)}/metrics",
                                         str(cfg.endpoint_drain_s)), **({"_sudo": True} if uses_sudo(host) else {}))
    left, waited = (out.stdout.split() + ["?", "?"])[:2] if ok else ("?", "?")
    host.log_styled("closed the endpoint to new requests (JSON 503, Retry-After); "
                    + ("no request in flight" if left == "0" and waited == "0" else
                       f"requests in flight finished after {waited} s" if left == "0" else
                       f"{left} request(s) still in flight after endpoint_drain_s={cfg.endpoint_drain_s} s: the "
                       "restart cuts them"), log_func=logger.info)
    return True



def switch_marker_path(cfg: NodeConfig) -> str:
    """Written on a node before a converge (re)starts its service, removed once the switch ended (gated, rolled back
    or failed): planned work, which the service-down alert does not page for (files/monitoring/node_facts.py). It
    holds its own bound, so a killed converge's marker stops counting by itself."""
    return f"/var/lib/inference-nodes/{cfg.container_name}.switching.json"


def switch_marker_command(cfg: NodeConfig) -> str:
    bound = cfg.service_ready_timeout_sec + cfg.endpoint_drain_s + 600  # the load, the drain, the gate's own minutes
    path = switch_marker_path(cfg)
    return (f"mkdir -p {posixpath.dirname(path)} && printf '{{\"until\": %s}}\\n' \"$(( $(date +%s) + {bound} ))\" "
            f"> {path}.tmp && mv -f {path}.tmp {path}")

"""Whether the running Prometheus loaded its configuration and rules (its own metrics say so), run on the monitoring host.

    python3 prometheus_loaded.py PORT                 # prints `loaded`, `not-loaded` or `down`
    python3 prometheus_loaded.py PORT --since EPOCH --wait S
        # after a reload asked for at EPOCH: waits until Prometheus reports it (a success at or after EPOCH, or a
        # failure), at most S seconds; prints the verdict, exit 0 only for `loaded`

A HUP (what `systemctl reload` sends) is asynchronous and a failed reload keeps the old rules running while
`systemctl` says "Reloaded": `prometheus_config_last_reload_successful` and its success time are the only witnesses.
Stdlib only.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.request

METRICS = ("prometheus_config_last_reload_successful", "prometheus_config_last_reload_success_timestamp_seconds")


def reload_state(text: str) -> dict[str, float]:
    """The two reload series from Prometheus's own /metrics text (missing ones absent)."""
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in METRICS:
            try:
                out[name] = float(value.split()[0])
            except (ValueError, IndexError):
                continue
    return out


def verdict(state: dict[str, float] | None, since: float | None = None) -> str:
    """`down` (no answer), `not-loaded` (the last reload failed), `loaded`, or `pending` (``since`` given: the last
    success is older than the reload asked for at ``since``, and no failure is reported yet)."""
    if state is None or METRICS[0] not in state:
        return "down"
    if state[METRICS[0]] != 1:
        return "not-loaded"
    if since is not None and state.get(METRICS[1], 0) < int(since):
        return "pending"
    return "loaded"


def read_state(port: int) -> dict[str, float] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return reload_state(r.read().decode("utf-8", "replace"))
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("port", type=int)
    ap.add_argument("--since", type=float)
    ap.add_argument("--wait", type=float, default=0.0)
    args = ap.parse_args(argv)
    end = time.monotonic() + args.wait
    while True:
        said = verdict(read_state(args.port), args.since)
        if said in ("loaded", "not-loaded") or time.monotonic() >= end:
            break
        time.sleep(0.5)
    print(said)
    return 0 if said == "loaded" or args.since is None else 1


if __name__ == "__main__":
    sys.exit(main())

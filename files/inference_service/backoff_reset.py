"""Reset the restart backoff of a service that has been healthy for a while (run by a systemd timer, as root).

    python3 backoff_reset.py --service grandpa.service --healthy-after 600

The unit restarts on any exit with a delay that grows over RestartSteps= restarts to RestartMaxDelaySec=, and
systemd never shrinks it again by itself: after a few self-heals in a unit's life, every later heal would wait
the longest delay. A manual restart or `systemctl reset-failed` sets the count back to zero; this does the second
once the service has been active, without another automatic restart, for HEALTHY_AFTER seconds (as Kubernetes
resets a container's back-off after ten minutes of running). Stdlib only; prints one line when it resets.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

PROPERTIES = ("ActiveState", "NRestarts", "ActiveEnterTimestampMonotonic")


def reset_due(state: dict[str, str], now_monotonic_s: float, healthy_after_s: float) -> bool:
    """Whether the backoff should go back to its first step now: the unit restarted by itself at least once, and
    has been active since its last start for ``healthy_after_s`` (systemd's monotonic clock, microseconds)."""
    try:
        restarts, entered_us = int(state.get("NRestarts", "")), int(state.get("ActiveEnterTimestampMonotonic", ""))
    except ValueError:
        return False
    if state.get("ActiveState") != "active" or restarts <= 0 or entered_us <= 0:
        return False
    return now_monotonic_s - entered_us / 1e6 >= healthy_after_s


def unit_state(service: str) -> dict[str, str]:
    out = subprocess.run(["systemctl", "show", *(f"--property={p}" for p in PROPERTIES), service],
                         capture_output=True, text=True, check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--service", required=True)
    ap.add_argument("--healthy-after", type=float, required=True, metavar="S")
    args = ap.parse_args(argv)
    state = unit_state(args.service)
    if not reset_due(state, time.monotonic(), args.healthy_after):
        return 0
    subprocess.run(["systemctl", "reset-failed", args.service], check=True)
    active = time.monotonic() - int(state["ActiveEnterTimestampMonotonic"]) / 1e6
    print(f"reset the restart backoff of {args.service}: {state['NRestarts']} automatic restart(s), active for "
          f"{active:.0f} s since the last")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Wait until a serving node's seed daemon listens, and stays up; stdlib only (runs on the node).

    python3 -c "$(cat seed_listening.py)" ADDRESS PORT UNIT

deploys/model/fanout.py (peers_served) sends this file's text with `python3 -c` right after `systemd-run`
started the daemon as UNIT. Exit status 0 once a connection to ADDRESS:PORT succeeds and UNIT is still active
a moment later (a daemon that binds and then dies, on a bad config say, serves no one); otherwise the exit
message names the address and the unit's last log lines.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from typing import Callable


def unit_active(unit: str) -> bool:
    return subprocess.run(["systemctl", "is-active", "--quiet", unit]).returncode == 0


def listening(address: str, port: int, active: Callable[[], bool], tries: int = 100, settle_s: float = 0.3) -> bool:
    """True once ``address:port`` accepts a connection and ``active()`` still holds ``settle_s`` later; False as
    soon as ``active()`` fails while nothing listens, or after ``tries`` attempts 0.1 s apart."""
    for _ in range(tries):
        try:
            socket.create_connection((address, port), 0.5).close()
        except OSError:
            if not active():
                return False
            time.sleep(0.1)
            continue
        time.sleep(settle_s)
        return active()
    return False


def main(argv: list[str]) -> int:
    address, port, unit = argv[0], int(argv[1]), argv[2]
    if listening(address, port, lambda: unit_active(unit)):
        return 0
    log = subprocess.run(["journalctl", "-u", unit, "-n", "3", "--no-pager", "-o", "cat"], capture_output=True,
                         text=True).stdout.strip().replace("\n", " | ")
    sys.exit(f"cannot serve peers on {address}:{port}: {unit} is not running ({log or 'no log'})")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

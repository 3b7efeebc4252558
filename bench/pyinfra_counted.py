#!/usr/bin/env python3
"""The pyinfra CLI, counting what it runs on each host: `python bench/pyinfra_counted.py COUNTS.json ARGS...`
runs `pyinfra ARGS...` and writes {host: {"commands": N, "uploads": M}} to COUNTS.json when it exits
(and every host's commands, in order, each with its wall seconds, to COUNTS.json.commands).
Commands are every shell command a fact or an operation runs over SSH (each one a round trip)."""

from __future__ import annotations

import atexit
import collections
import json
import sys
import time

from pyinfra.connectors.ssh import SSHConnector

COUNTS: dict[str, dict[str, int]] = collections.defaultdict(lambda: {"commands": 0, "uploads": 0})
_run, _put = SSHConnector.run_shell_command, SSHConnector.put_file


COMMANDS: dict[str, list[tuple[float, str]]] = collections.defaultdict(list)


def _counted_run(self, *args, **kwargs):
    COUNTS[self.host.name]["commands"] += 1
    t0 = time.perf_counter()
    try:
        return _run(self, *args, **kwargs)
    finally:
        COMMANDS[self.host.name].append((round(time.perf_counter() - t0, 3),
                                         str(args[0] if args else kwargs.get("command"))[:300]))


def _counted_put(self, *args, **kwargs):
    COUNTS[self.host.name]["uploads"] += 1
    return _put(self, *args, **kwargs)


def main() -> None:
    out, sys.argv = sys.argv[1], ["pyinfra", *sys.argv[2:]]
    SSHConnector.run_shell_command, SSHConnector.put_file = _counted_run, _counted_put

    def write() -> None:
        with open(out, "w") as f:
            json.dump(COUNTS, f, sort_keys=True)
        with open(out + ".commands", "w") as f:  # what each host ran, in order, timed (to see what to batch)
            json.dump(COMMANDS, f, indent=1)

    atexit.register(write)
    from pyinfra_cli.main import main as pyinfra_main

    pyinfra_main()


if __name__ == "__main__":
    main()

"""The unit tier on every core: pytest-split's groups, balanced by the recorded durations of each test
(tests/unit/durations.json), run side by side, one pytest process each:

    python -m tests.unit_tier [--jobs N] [--store-durations] [pytest arguments...]

Why not pytest-xdist: its workers wait on an execnet queue whose Event pyinfra's CLI replaces when it
monkey-patches the standard library with gevent (tests/unit/conftest.py must import it first), so every
worker dies with gevent's LoopExit. Separate processes have no such queue.

Each group's output is printed whole when it ends (never interleaved), then one summary line per group;
each group also writes a junit file under test-results/ (every test's duration, kept for the next slowdown).
Exit status: the worst of the groups'. `--store-durations` runs the tier in one process and records each
test's duration for the balance (commit the file; tests it does not know count as the average)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

DURATIONS = "tests/unit/durations.json"
RESULTS = "test-results"


def summary(output: str) -> str:
    """pytest's last summary line (``N passed, M skipped in S s``), or the output's last line."""
    lines = [ln.strip("= ") for ln in output.splitlines() if ln.strip()]
    found = [ln for ln in lines if re.search(r"\b(passed|failed|error|no tests ran)\b", ln) and " in " in ln]
    return (found or lines or ["(no output)"])[-1]


def group_command(group: int, jobs: int, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "tests/unit", "--splits", str(jobs),
            "--group", str(group), "--splitting-algorithm", "least_duration", "--durations-path", DURATIONS,
            f"--junitxml={RESULTS}/unit-{group}.xml", *extra]


def main(argv: list[str]) -> int:
    jobs = os.cpu_count() or 1
    if argv[:1] == ["--jobs"]:
        jobs, argv = int(argv[1]), argv[2:]
    os.makedirs(RESULTS, exist_ok=True)
    if argv[:1] == ["--store-durations"]:
        return subprocess.run([sys.executable, "-m", "pytest", "tests/unit", "-q",
                               "--store-durations", "--durations-path", DURATIONS, *argv[1:]]).returncode
    t0 = time.monotonic()
    running = []
    for group in range(1, jobs + 1):
        out = tempfile.TemporaryFile(mode="w+")
        running.append((group, out, subprocess.Popen(group_command(group, jobs, argv), stdout=out,
                                                     stderr=subprocess.STDOUT, text=True)))
    worst, lines = 0, []
    for group, out, proc in running:
        rc = proc.wait()
        out.seek(0)
        text = out.read()
        print(f"---- unit tier, group {group} of {jobs} ----\n{text}", flush=True)
        lines.append(f"unit tier group {group}/{jobs}: {summary(text)} (exit {rc})")
        worst = max(worst, rc)
    print("\n".join(lines))
    print(f"unit tier: {jobs} groups side by side in {time.monotonic() - t0:.0f} s: "
          + ("passed" if worst == 0 else f"FAILED (exit {worst})"))
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

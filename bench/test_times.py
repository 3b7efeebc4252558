#!/usr/bin/env python3
"""Where a test run's time went: per-module seconds and test counts from pytest's junit files (`make test` writes
them under test-results/), optionally beside an earlier run's, then the slowest tests. Not a test.

    python bench/test_times.py [FILE.xml ...] [--vs EARLIER.xml ...] [--slowest N]

Without files it reads test-results/*.xml. Prints a markdown table (the one docs/testing.md quotes) and ends with
one line for automated checks:

    test_times: modules=M tests=T total_s=S slowest=NAME:SECONDS
"""

from __future__ import annotations

import argparse
import glob
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def cases(paths: list[str]) -> list[tuple[str, str, float, str]]:
    """(module, test, seconds, outcome) of every test case in the junit files."""
    out = []
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            classname, name = case.get("classname", ""), case.get("name", "")
            parts = classname.split(".")  # tests.node.test_60_x[.TestClass]: the module is the last test_ part
            modules = [i for i, part in enumerate(parts) if part.startswith("test_")]
            module = ".".join(parts[: modules[-1] + 1]) if modules else classname
            outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
            out.append((module.replace(".", "/") + ".py" if module else name, name, float(case.get("time", 0)), outcome))
    return out


def by_module(rows: list[tuple[str, str, float, str]]) -> dict[str, tuple[int, float]]:
    acc: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for module, _, seconds, _ in rows:
        acc[module][0] += 1
        acc[module][1] += seconds
    return {m: (n, s) for m, (n, s) in acc.items()}


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:04.1f} s" if seconds >= 60 else f"{seconds:.1f} s"


def table(now: dict[str, tuple[int, float]], before: dict[str, tuple[int, float]] | None) -> list[str]:
    head = "| module | tests | time |" + (" before: tests | before: time |" if before is not None else "")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for module in sorted(set(now) | set(before or {})):
        n, s = now.get(module, (0, 0.0))
        row = f"| {module} | {n} | {minutes(s)} |"
        if before is not None:
            bn, bs = before.get(module, (0, 0.0))
            row += f" {bn} | {minutes(bs)} |"
        lines.append(row)
    total = f"| **all** | {sum(n for n, _ in now.values())} | {minutes(sum(s for _, s in now.values()))} |"
    if before is not None:
        total += f" {sum(n for n, _ in before.values())} | {minutes(sum(s for _, s in before.values()))} |"
    return lines + [total]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*")
    parser.add_argument("--vs", nargs="+", default=None, help="an earlier run's junit files, shown beside")
    parser.add_argument("--slowest", type=int, default=15)
    args = parser.parse_args(argv)
    files = args.files or sorted(glob.glob("test-results/*.xml"))
    if not files:
        print("test_times: no junit files (run `make test`, or name them)", file=sys.stderr)
        return 2
    rows = cases(files)
    now = by_module(rows)
    before = by_module(cases(args.vs)) if args.vs else None
    print("\n".join(table(now, before)))
    slow = sorted(rows, key=lambda r: -r[2])[: args.slowest]
    print(f"\nslowest {len(slow)} tests:")
    for module, name, seconds, outcome in slow:
        print(f"  {seconds:7.1f} s  {module}::{name}" + ("" if outcome == "passed" else f"  ({outcome})"))
    top = slow[0] if slow else ("-", "-", 0.0, "")
    print(f"test_times: modules={len(now)} tests={len(rows)} total_s={sum(r[2] for r in rows):.0f} "
          f"slowest={top[1]}:{top[2]:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

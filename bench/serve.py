#!/usr/bin/env python3
"""Serving benchmark: from a converged sandbox (`make demo`), the time from `systemctl start` to /health
answering and to the serving gate passing, for the one-node profile (sandbox-a: deployment A's env
contract, TP=2 in one node) and the two-node profile (sandbox-b0 + sandbox-b1: one TP=2 job across two
nodes), first start (compile cache emptied) and restart (cache kept). Prints a table; not a test.

    python bench/serve.py [--profiles one,two]

The other profile's services are stopped while one is measured (2 cores: they would share them), and
everything is started again at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from deploys.inference_service import served_model_name  # noqa: E402
from deploys.inventory import inventory_configs, load_inventory  # noqa: E402
from deploys.serving_gate import GATE, wait_ready  # noqa: E402

NODE_SH = os.path.join(ROOT, "tests/sandbox/node.sh")
PROFILES = {"one": ["sandbox-a"], "two": ["sandbox-b1", "sandbox-b0"]}  # workers first


def on_node(name: str, command: str) -> str:
    proc = subprocess.run([NODE_SH, "ssh", name, command], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: {command}: {proc.stderr.strip()}")
    return proc.stdout


def measure(nodes: list[str], configs, first: bool) -> tuple[float, float, str]:
    head = configs[nodes[-1]]
    service = f"{head.container_name}.service"
    for name in reversed(nodes):
        on_node(name, f"systemctl stop {configs[name].container_name}.service")
    if first:
        for name in nodes:
            cfg = configs[name]
            on_node(name, f"rm -rf {cfg.jit_cache_dir}/vllm")
    t0 = time.monotonic()
    for name in nodes:
        on_node(name, f"systemctl start {configs[name].container_name}.service")
    try:
        wait_ready(f"http://127.0.0.1:{head.api_port}", 1800, interval=1)
    except TimeoutError as e:
        raise SystemExit(f"{nodes[-1]}: {service}: {e}") from None
    ready = time.monotonic() - t0
    gate = subprocess.run([sys.executable, GATE, f"http://127.0.0.1:{head.api_port}", served_model_name(head)],
                          capture_output=True, text=True, timeout=600)
    failed = [c["check"] for c in map(json.loads, gate.stdout.splitlines()) if not c["ok"]]
    return ready, time.monotonic() - t0, "pass" if gate.returncode == 0 else "FAIL " + ",".join(failed)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", default="one,two")
    parser.add_argument("--inventory", default=os.path.join(ROOT, "inventories/sandbox.py"))
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    configs = inventory_configs(load_inventory(args.inventory))
    rows = []
    try:
        for profile in args.profiles.split(","):
            others = [n for p, ns in PROFILES.items() if p != profile for n in ns]
            for name in others:
                on_node(name, f"systemctl stop {configs[name].container_name}.service")
            for first in (True, False):
                ready, gated, verdict = measure(PROFILES[profile], configs, first)
                rows.append((profile, "first start" if first else "restart", ready, gated, verdict))
    finally:
        for nodes in PROFILES.values():
            for name in nodes:
                subprocess.run([NODE_SH, "ssh", name, f"systemctl start {configs[name].container_name}.service"],
                               capture_output=True, timeout=300)
    print("| profile | start | to /health (s) | to gate passed (s) | gate |")
    print("|---|---|---:|---:|---|")
    for profile, kind, ready, gated, verdict in rows:
        label = {"one": "one node, TP=2 (A's env contract)", "two": "two nodes, TP=2 (B's launch flags)"}[profile]
        print(f"| {label} | {kind} | {ready:.1f} | {gated:.1f} | {verdict} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

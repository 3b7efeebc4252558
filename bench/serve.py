#!/usr/bin/env python3
"""Serving benchmark: from a converged sandbox (`make demo`), the time from `systemctl start` to /health
answering and to the serving gate passing, for the one-node profile (sandbox-a: deployment A's env
contract, TP=2 in one node) and the two-node profile (sandbox-b0 + sandbox-b1: one TP=2 job across two
nodes), first start (compile cache emptied) and restart (cache kept). Then, with `--converges`, the time a
converge takes until it ends, gate passed (the converge waits for it): a first deploy (service stopped, no gate
record, compile cache emptied), an upgrade to another model commit (the stand-in hub's other good commit;
back to the inventory's after), and a failed upgrade (the scrambled commit: the gate fails and the cluster
rolls back, workers first). With `--drills`: what a LAN client of sandbox-a's endpoint saw through a failed switch
(answers, wrong answers, JSON 503 seconds, other failures, whether a stream in flight completed), and how long the
pair took to serve again by itself, no converge, after its worker's reboot and after its head's container was
killed. Prints tables; not a test.

    python bench/serve.py [--profiles one,two] [--converges] [--drills]

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

from deploys.service.release import gate_record_path  # noqa: E402
from deploys.service.unit import served_model_name  # noqa: E402
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


PYINFRA = os.path.join(os.path.dirname(sys.executable), "pyinfra")
SANDBOX_DIR = os.environ.get("SANDBOX_DIR", "/var/tmp/inference-nodes-sandbox")
OTHER_GOOD = {"one": "9e165c30e2704aec5d9d593cce3eebd58bbef1cb", "two": "7872f01b1d1fe23eabc4c98b48bffcef5a386062"}


def converge(inventory: str, nodes: list[str], *data: str) -> tuple[float, int, str]:
    """Seconds a converge of ``nodes`` takes (it ends once the heads passed the gate, or failed), its exit status,
    and its last line that says what happened to the release."""
    args = [a for n in nodes for a in ("--limit", n)] + [a for d in data for a in ("--data", d)]
    t0 = time.monotonic()
    proc = subprocess.run([PYINFRA, "-y", inventory, "deploys/all.py", *args], capture_output=True, text=True,
                          timeout=3600)
    said = [line.strip() for line in proc.stderr.splitlines() if "rolled back" in line or "left as it is" in line
            or "passed the serving gate (" in line]
    return time.monotonic() - t0, proc.returncode, (said[-1][:160] if said else proc.stderr.strip()[-160:])


def manifest_data(commit: str) -> list[str]:
    return [f"model_revision={commit}",
            f"model_manifest={SANDBOX_DIR}/manifests/deepseek-ai--DeepSeek-V4-Flash-0731@{commit}.json"]


def measure_converges(profile: str, configs, inventory: str) -> list[tuple[str, float, int, str]]:
    from tests.sandbox.standin_hub import BROKEN_COMMIT

    nodes = PROFILES[profile]
    rows = []
    for name in reversed(nodes):
        cfg = configs[name]
        on_node(name, f"systemctl stop {cfg.container_name}.service; rm -rf {cfg.jit_cache_dir}/vllm "
                      f"{gate_record_path(cfg)}")
    rows.append(("first deploy", *converge(inventory, nodes)))
    rows.append(("upgrade to another model commit", *converge(inventory, nodes, *manifest_data(OTHER_GOOD[profile]))))
    converge(inventory, nodes)  # back to the inventory's release
    rows.append(("failed upgrade (scrambled commit)", *converge(inventory, nodes, *manifest_data(BROKEN_COMMIT))))
    converge(inventory, nodes)
    return rows


def wait_gated(head: str, configs, old_container: str, bound: float = 900) -> float:
    """Seconds until ``head`` runs in a new container and passes the serving gate, no converge in between."""
    cfg = configs[head]
    inspect = f"podman container inspect --format '{{{{.Id}}}}' {cfg.container_name} 2>/dev/null; true"
    t0 = time.monotonic()
    while on_node(head, inspect).strip() in (old_container, ""):
        if time.monotonic() - t0 > bound:
            raise SystemExit(f"{head} did not restart by itself within {bound:.0f} s")
        time.sleep(2)
    while True:
        try:
            wait_ready(f"http://127.0.0.1:{cfg.api_port}", max(1.0, bound - (time.monotonic() - t0)), interval=1)
        except TimeoutError as e:
            raise SystemExit(f"{head}: {e}") from None
        gate = subprocess.run([sys.executable, GATE, f"http://127.0.0.1:{cfg.api_port}", served_model_name(cfg)],
                              capture_output=True, text=True, timeout=600)
        if gate.returncode == 0:
            return time.monotonic() - t0
        if time.monotonic() - t0 > bound:
            raise SystemExit(f"{head} did not pass the gate within {bound:.0f} s")
        time.sleep(3)


def measure_drills(configs, inventory: str) -> list[tuple[str, str, str]]:
    """(drill, what happened, figure) rows."""
    from tests.sandbox.endpoint_client import EndpointClient
    from tests.sandbox.standin_hub import BROKEN_COMMIT

    rows = []
    with EndpointClient("sandbox-a", inventory) as client:
        seconds, rc, said = converge(inventory, ["sandbox-a"], *manifest_data(BROKEN_COMMIT))
        time.sleep(3)
    rows.append(("a client through a failed switch of sandbox-a (scrambled commit, rolled back)", client.summary(),
                 f"{seconds:.0f} s converge, {client.seen['wrong']} wrong answers, {client.closed_s:.0f} s of 503"))
    converge(inventory, ["sandbox-a"])  # the inventory's release again (nothing to do)
    head, worker = "sandbox-b0", "sandbox-b1"
    inspect = f"podman container inspect --format '{{{{.Id}}}}' {configs[head].container_name} 2>/dev/null; true"
    old = on_node(head, inspect).strip()
    t0 = time.monotonic()
    subprocess.run([PYINFRA, "-y", inventory, "server.reboot", "delay=5", "interval=1", "reboot_timeout=180", "--limit",
                    worker], capture_output=True, text=True, timeout=600, check=True)
    wait_gated(head, configs, old)
    rows.append(("the pair after its worker's reboot (no converge)", "serves again, gate passed",
                 f"{time.monotonic() - t0:.0f} s from the reboot command"))
    old = on_node(head, inspect).strip()
    t0 = time.monotonic()
    on_node(head, f"podman kill {configs[head].container_name}")
    wait_gated(head, configs, old)
    rows.append(("the pair after its head's container was killed (no converge)", "serves again, gate passed",
                 f"{time.monotonic() - t0:.0f} s"))
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", default="one,two")
    parser.add_argument("--inventory", default=os.path.join(ROOT, "inventories/sandbox.py"))
    parser.add_argument("--converges", action="store_true", help="also time converges until the gate passed")
    parser.add_argument("--drills", action="store_true", help="also a client through a failed switch, and the pair's "
                        "own recovery after a worker's reboot and a head's crash")
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    configs = inventory_configs(load_inventory(args.inventory))
    rows, converges, drills = [], [], []
    try:
        for profile in args.profiles.split(","):
            others = [n for p, ns in PROFILES.items() if p != profile for n in ns]
            for name in others:
                on_node(name, f"systemctl stop {configs[name].container_name}.service")
            for first in (True, False):
                ready, gated, verdict = measure(PROFILES[profile], configs, first)
                rows.append((profile, "first start" if first else "restart", ready, gated, verdict))
            if args.converges:
                converges += [(profile, *row) for row in measure_converges(profile, configs, args.inventory)]
        if args.drills:
            for nodes in PROFILES.values():
                for name in nodes:
                    on_node(name, f"systemctl start {configs[name].container_name}.service")
            for name in ("sandbox-a", "sandbox-b0"):
                wait_ready(f"http://127.0.0.1:{configs[name].api_port}", 1800, interval=1)
            drills = measure_drills(configs, args.inventory)
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
    if converges:
        print()
        print("| profile | converge | until it ended (s) | exit | what it said last |")
        print("|---|---|---:|---:|---|")
        for profile, kind, seconds, rc, said in converges:
            label = {"one": "one node", "two": "two nodes"}[profile]
            print(f"| {label} | {kind} | {seconds:.1f} | {rc} | {said.replace('|', '/')} |")
    if drills:
        print()
        print("| drill | what the client or the pair saw | figure |")
        print("|---|---|---|")
        for drill, saw, figure in drills:
            print(f"| {drill} | {saw} | {figure} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""Converge benchmark: wall time of the first converge and of a no-op re-converge of deploys/all.py on
1, 2 and 4 sandbox nodes in parallel, with the count of operations, changes and the remote commands each
host ran in the no-op run (bench/pyinfra_counted.py). Prints a table; not a test.

    python bench/converge.py [--nodes 1,2,4] [--keep DIR] [--noop-only DIR] [--runs 3]

--keep DIR leaves the last row's nodes up and its inventories in DIR; --noop-only DIR then times no-op runs
against the nodes already up (with --nodes 1 against the first of them), to profile without re-booting.

Each node runs deployment A's profile as a cluster of its own (the reference profile, one node each),
with TP=1 so that four real vLLMs fit this machine; the no-op runs start once every node answers /health.
Needs what `make test` needs (root, the sandbox harness); boots and tears down its own nodes.
Targets (2-core machine): no-op re-converge of one full node <= 5.0 s; four nodes <= 1.2x one node.
Ends with one line for automated checks:

    converge: noop_1node_s=X.X noop_4node_ratio=Y.YY remote_commands_per_host=N
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from deploys.serving_gate import wait_ready  # noqa: E402

NODE_SH = os.path.join(ROOT, "tests/sandbox/node.sh")
COUNTED = os.path.join(ROOT, "bench/pyinfra_counted.py")
SANDBOX_DIR = os.environ.get("SANDBOX_DIR", "/var/tmp/inference-nodes-sandbox")
COMMIT_A = "7872f01b1d1fe23eabc4c98b48bffcef5a386062"

INVENTORY = '''
import os
import runpy
_DIR = {sandbox_dir!r}
_A_ENV = runpy.run_path({sandbox_inventory!r})["_A_ENV"]  # A's env contract fitted to the sandbox's CPU vLLM
_M = f"{{_DIR}}/manifests/deepseek-ai--DeepSeek-V4-Flash-0731@{commit}.json"

def _node(i):
    return (f"bench-{{i}}", {{"ssh_hostname": "127.0.0.1", "ssh_port": 2300 + i, "ssh_user": "root",
        "ssh_key": f"{{_DIR}}/ssh/id_ed25519", "ssh_strict_host_key_checking": "off",
        "ssh_known_hosts_file": "/dev/null", "_sudo": False, "cluster_name": f"bench-{{i}}",
        "api_port": 8200 + i, "model_peer_port": 8740 + i, "service_env": _A_ENV,
        "tensor_parallel_size": 1, "gpu_indices": [0],  # one vLLM process per node: four fit this machine
        "endpoint_enabled": False,  # as the figures before the endpoint existed (profile A has it on in the lab)
        **({{"model_manifest": _M}} if os.path.exists(_M) else {{}})}})

rtx_pro_6000_pair = [_node(i) for i in range({n})]
'''


def run(cmd, **kw):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, **kw)


def converge(inventory: str) -> tuple[float, int, int, int, int]:
    """(wall s, operations, changed, hosts fed by a peer, most remote commands any host ran)."""
    counts = inventory + ".counts.json"
    t0 = time.perf_counter()
    proc = run([sys.executable, COUNTED, counts, "-y", "-v", "--json", "--group-data", "inventories/group_data",
                inventory, "deploys/all.py"])
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"converge failed:\n{proc.stderr[-3000:]}")
    totals = json.loads(proc.stdout)["results"]["totals"]
    peer_fed = sum(1 for line in proc.stderr.splitlines() if "pulled" in line and "from peer" in line)
    with open(counts) as f:
        commands = max(c["commands"] for c in json.load(f).values())
    if os.environ.get("BENCH_COMMANDS_DIR"):  # keep what each host ran, to see what to batch
        shutil.copy(counts + ".commands", os.path.join(os.environ["BENCH_COMMANDS_DIR"], os.path.basename(
            os.path.dirname(inventory)) + ".commands.json"))
    return wall, totals["hosts"], totals["success"], peer_fed, commands


def healthy(port: int, timeout: float = 900) -> None:
    try:
        wait_ready(f"http://127.0.0.1:{port}", timeout)
    except TimeoutError as e:
        raise SystemExit(str(e)) from None


def write_inventory(n: int, tmp: str) -> str:
    # named sandbox.py so that the sandbox's stand-in group data (its file-name group) applies
    os.makedirs(os.path.join(tmp, f"bench{n}"), exist_ok=True)
    inventory = os.path.join(tmp, f"bench{n}", "sandbox.py")
    with open(inventory, "w") as f:
        f.write(INVENTORY.format(sandbox_dir=SANDBOX_DIR, commit=COMMIT_A, n=n,
                                 sandbox_inventory=os.path.join(ROOT, "inventories/sandbox.py")))
    return inventory


def noop(n: int, tmp: str, runs: int) -> dict:
    """Best of ``runs`` no-op converges of the first ``n`` nodes already up (--noop-only)."""
    inventory = write_inventory(n, tmp)
    for i in range(n):
        healthy(8200 + i)
    walls = [converge(inventory) for _ in range(runs)]
    print(f"nodes={n} no-op runs (s): " + " ".join(f"{w[0]:.2f}" for w in walls), file=sys.stderr)
    best, _, changed_noop, _, commands = min(walls)
    return {"nodes": n, "first_s": float("nan"), "noop_s": best, "ops": walls[0][1], "changed_first": 0,
            "changed_noop": changed_noop, "peer_fed": 0, "commands_noop": commands}


def bench(n: int, tmp: str, keep: bool = False, runs: int = 3) -> dict:
    inventory = write_inventory(n, tmp)
    run([NODE_SH, "down-all"])
    for i in range(n):
        up = run([NODE_SH, "up", f"bench-{i}", str(2300 + i), "2"])
        if up.returncode != 0:
            raise SystemExit(up.stderr)
    gen = run([sys.executable, "-m", "tests.sandbox.nodes", "--manifests"])
    if gen.returncode != 0:
        raise SystemExit(gen.stderr)
    try:
        first, ops, changed_first, peer_fed, _ = converge(inventory)
        for i in range(n):  # no-op runs timed on idle nodes, not beside vLLM's start-up compile
            healthy(8200 + i)
        noop, _, changed_noop, _, commands = min(converge(inventory) for _ in range(runs))  # best of --runs
    finally:
        if not keep:
            run([NODE_SH, "down-all"])
    return {"nodes": n, "first_s": first, "noop_s": noop, "ops": ops, "changed_first": changed_first,
            "changed_noop": changed_noop, "peer_fed": peer_fed, "commands_noop": commands}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="1,2,4")
    ap.add_argument("--keep", metavar="DIR", help="leave the last row's nodes up, inventories in DIR")
    ap.add_argument("--noop-only", metavar="DIR", help="only no-op runs, against nodes already up")
    ap.add_argument("--runs", type=int, default=3, help="no-op runs per row (the best counts)")
    args = ap.parse_args()
    rows = []
    counts = [int(x) for x in args.nodes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        for i, n in enumerate(counts):
            if args.noop_only:
                rows.append(noop(n, args.noop_only, args.runs))
            else:
                keep = bool(args.keep) and i == len(counts) - 1
                rows.append(bench(n, args.keep if keep else tmp, keep, args.runs))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; deploys/all.py, deployment A's profile per node")
    print("| nodes | first converge (s) | no-op re-converge (s) | operations | changed (first) | changed (no-op) "
          "| model fed by a peer | remote commands per host (no-op) |")
    print("|------:|-------------------:|----------------------:|-----------:|----------------:|----------------:"
          "|--------------------:|---------------------------------:|")
    for r in rows:
        print(f"| {r['nodes']} | {r['first_s']:.1f} | {r['noop_s']:.1f} | {r['ops']} | {r['changed_first']} "
              f"| {r['changed_noop']} | {r['peer_fed']} | {r['commands_noop']} |")
    one = next((r for r in rows if r["nodes"] == 1), None)
    four = next((r for r in rows if r["nodes"] == 4), None)
    ratio = four["noop_s"] / one["noop_s"] if one and four else float("nan")
    if one:
        print(f"converge: noop_1node_s={one['noop_s']:.1f} noop_4node_ratio={ratio:.2f} "
              f"remote_commands_per_host={one['commands_noop']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

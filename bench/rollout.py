#!/usr/bin/env python3
"""Rollout benchmark: from a converged sandbox (`make demo`), a rollout of a good release to both clusters (A's
environment gains a variable, the pair's vLLM a `--seed`, both new each run), timed per phase against its lower
bound, then `--abort`, which puts the sandbox's own releases back, timed the same way. The lower bound of a wave is
its slowest cluster's switch (its door closed until its gate and release bench passed: the head's gate record's
`switch_s`) plus the bake: what no rollout of these waves can go below; the rest is the control node's share
(pyinfra's connections, facts and the steps around the switch). Prints a table, and the rollout's closing table
(each head's release bench against the release before); not a test.

    python bench/rollout.py [--bake-s S]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from deploys.inventory import inventory_configs, load_inventory  # noqa: E402
from deploys.service.release import gate_record_path  # noqa: E402

NODE_SH = os.path.join(ROOT, "tests/sandbox/node.sh")
INVENTORY = os.path.join(ROOT, "inventories/sandbox.py")
def edits(token: int) -> tuple[tuple[str, str], ...]:
    """A new release of both clusters, its own each run (``token``): an aborted release is recorded as failed, and a
    rollout of it again would be held back."""
    return (('_A_ENV = {**runpy.run_path(_A_PROFILE)["service_env"],',
             f'_A_ENV = {{**runpy.run_path(_A_PROFILE)["service_env"], "INFERENCE_NODES_BENCH": "{token}",'),
            ('_CPU_VLLM_ARGS = ["--max-model-len", "2048",',
             f'_CPU_VLLM_ARGS = ["--max-model-len", "2048", "--seed", "{token}",'))


def new_release_inventory(where: str) -> str:
    """The sandbox inventory asking both clusters for a new, good release (beside the sandbox's group data)."""
    with open(INVENTORY) as f:
        text = f.read()
    for old, new in edits(int(time.time()) % 1_000_000 + 1):  # (seed 0 is test_90's)
        if old not in text:
            raise SystemExit(f"{INVENTORY} no longer has {old!r}")
        text = text.replace(old, new)
    os.symlink(os.path.join(ROOT, "inventories/group_data"), os.path.join(where, "group_data"))
    path = os.path.join(where, "sandbox.py")
    with open(path, "w") as f:
        f.write(text)
    return path


def timed_rollout(inventory: str, state: str, *args: str) -> tuple[int, list[tuple[float, str]]]:
    """Run the rollout; (its exit status, each of its own lines with the seconds since it began)."""
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "deploys.rollout", inventory, *args], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "XDG_STATE_HOME": state})
    lines = [(time.monotonic() - t0, line.rstrip()) for line in proc.stdout]
    lines.append((time.monotonic() - t0, "(ended)"))
    return proc.wait(), lines


def switch_s(configs, heads: dict[str, str]) -> dict[str, float]:
    """Each cluster's last switch as its head recorded it (door closed until the gate passed), in seconds."""
    out = {}
    for cluster, head in heads.items():
        proc = subprocess.run([NODE_SH, "ssh", head, f"cat {gate_record_path(configs[head])}"], capture_output=True,
                              text=True, timeout=120)
        out[cluster] = float(json.loads(proc.stdout).get("switch_s") or 0) if proc.returncode == 0 else float("nan")
    return out


def phases(lines: list[tuple[float, str]]) -> list[tuple[str, float]]:
    """(phase, seconds) from the rollout's own lines: each `rollout: ...ing` line to the next."""
    marks = [(t, text[len("rollout: "):]) for t, text in lines if text.startswith("rollout: ") and
             ("staging" in text or "switching" in text or "aborting" in text)]
    end = lines[-1][0]
    return [(what, (marks[i + 1][0] if i + 1 < len(marks) else end) - t) for i, (t, what) in enumerate(marks)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bake-s", type=int, default=0)
    args = parser.parse_args()
    configs = inventory_configs(load_inventory(INVENTORY))
    heads = {cfg.cluster_name: name for name, cfg in configs.items() if getattr(cfg, "is_head", False)}
    rows, tables = [], []
    with tempfile.TemporaryDirectory() as tmp:
        inventory, state = new_release_inventory(tmp), os.path.join(tmp, "state")
        for label, extra in (("rollout", ("--bake-s", str(args.bake_s))), ("abort", ("--abort",))):
            rc, lines = timed_rollout(inventory, state, *extra)
            if rc != 0:
                print("\n".join(text for _, text in lines[-40:]))
                raise SystemExit(f"the {label} exited {rc}")
            if label == "rollout":  # where the lab stood then, as the rollout printed it
                tables.append("\n".join(text for _, text in lines if not text.startswith(("rollout: ", "(ended)"))))
            switched = switch_s(configs, heads)
            for what, took in phases(lines):
                clusters = [c for c in heads if c in what]
                bound = (max(switched[c] for c in clusters) + (args.bake_s if "wave" in what else 0)
                         if "switching" in what or "aborting" in what else None)
                rows.append((label, what, took, bound))
            rows.append((label, "total", lines[-1][0], None))
    print("| run | phase | took (s) | lower bound (s) | control node's share (s) |\n|---|---|---|---|---|")
    for label, what, took, bound in rows:
        print(f"| {label} | {what} | {took:.0f} | {'-' if bound is None else f'{bound:.0f}'} | "
              f"{'-' if bound is None else f'{took - bound:.0f}'} |")
    print("\nthe rollout's closing table:\n" + "\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The lab rollout (python -m deploys.rollout) on the sandbox's two clusters (deployment A's one node, the pair), with
the real pyinfra runs, the real vLLM and the real door: a stage that fails on one cluster switches nothing and halts;
`--resume` with the inventory fixed stages what is left, switches the canary (A) first and then the pair, gated, and
the ledger and the lab's standing say so. Then the sandbox's own inventory is converged back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime

import pytest

from deploys.ops import staged_path
from tests.node.conftest import INVENTORY, inventory_copy, on_node, pyinfra

pytestmark = pytest.mark.lifecycle

UNITS = {"sandbox-a": "grandpa.service", "sandbox-b0": "inference.service", "sandbox-b1": "inference.service"}


def started(node: str) -> tuple[str, datetime]:
    """The service's invocation and when its main process started, by the wall clock: each node's CLOCK_MONOTONIC
    is its own (a time namespace, reset when the node reboots), the realtime clock is the machine's."""
    out = on_node(node, "systemctl show --timestamp=us+utc -p InvocationID -p ExecMainStartTimestamp "
                        + UNITS[node]).stdout
    fields = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return fields["InvocationID"], datetime.strptime(fields["ExecMainStartTimestamp"], "%a %Y-%m-%d %H:%M:%S.%f %Z")


def rollout(inventory: str, state: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deploys.rollout", inventory, *args], capture_output=True, text=True,
                          timeout=2400, env={**os.environ, "XDG_STATE_HOME": state})


def test_a_rollout_stages_everything_first_halts_on_a_failed_stage_and_resumes_canary_first(sandbox, tmp_path):
    state = str(tmp_path / "state")
    a_env = '_A_ENV = {**runpy.run_path(_A_PROFILE)["service_env"],'
    b_args = '_CPU_VLLM_ARGS = ["--max-model-len", "2048",'
    # a new release for both clusters: A's environment gains a variable, the pair's vLLM a flag its image refuses
    broken = inventory_copy(tmp_path, (a_env, a_env + ' "INFERENCE_NODES_DRILL": "rollout",'),
                            (b_args, b_args + ' "--no-such-flag",'))
    before = {n: started(n) for n in UNITS}
    halted = rollout(broken, state)
    assert halted.returncode == 1, halted.stdout[-3000:] + halted.stderr[-3000:]
    assert "halted: the stage failed on gb10-dspark: no cluster switched" in halted.stdout, halted.stdout[-3000:]
    assert {n: started(n) for n in UNITS} == before, "a service restarted while the rollout staged"
    [ledger_file] = os.listdir(os.path.join(state, "inference-nodes", "rollouts"))
    with open(os.path.join(state, "inference-nodes", "rollouts", ledger_file)) as f:
        ledger = json.load(f)
    assert {c: e["state"] for c, e in ledger["clusters"].items()} == {"rtx-pro-6000-pair": "staged",
                                                                      "gb10-dspark": "failed"}
    # A's new environment waits out of systemd's reach; the one its service reads is unchanged
    live = "/etc/inference-nodes/grandpa.service.env"
    assert on_node("sandbox-a", f"grep -c INFERENCE_NODES_DRILL {staged_path(live)}").stdout.strip() == "1"
    assert on_node("sandbox-a", f"grep -c INFERENCE_NODES_DRILL {live}").stdout.strip() == "0"
    refused = rollout(broken, state)
    assert refused.returncode == 2 and "--resume once the inventory is fixed" in refused.stderr

    # the inventory fixed (the pair's new flag is one its vLLM knows): the rollout resumes
    fixed = inventory_copy(tmp_path, (a_env, a_env + ' "INFERENCE_NODES_DRILL": "rollout",'),
                           (b_args, b_args + ' "--seed", "0",'))
    os.replace(fixed, broken)  # (the same inventory file: the ledger is the inventory's)
    resumed = rollout(broken, state, "--resume")
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-3000:]
    out = resumed.stdout
    assert out.index("rollout: staging gb10-dspark") < out.index("rollout: wave 0: switching rtx-pro-6000-pair") \
        < out.index("rollout: wave 1: switching gb10-dspark"), out[-3000:]
    after = {n: started(n) for n in UNITS}
    assert all(after[n][0] != before[n][0] for n in UNITS), (before, after)
    # the canary's service started before either member of the pair restarted
    assert after["sandbox-a"][1] < min(after["sandbox-b0"][1], after["sandbox-b1"][1]), after
    with open(os.path.join(state, "inference-nodes", "rollouts", ledger_file)) as f:
        ledger = json.load(f)
    assert ledger["halted"] is None and {e["state"] for e in ledger["clusters"].values()} == {"switched"}
    assert ledger["clusters"]["rtx-pro-6000-pair"]["before"]["model_revision"].startswith("7872f01b1d1f")
    standing = subprocess.run([sys.executable, "-m", "deploys.lab_status", broken, "--json"], capture_output=True,
                              text=True, timeout=120)
    assert standing.returncode == 0 and {r["state"] for r in json.loads(standing.stdout)} == {"live"}, standing.stdout
    # back to the sandbox's own inventory (both clusters at once: a plain converge keeps working as before)
    pyinfra(INVENTORY, "deploys/all.py")

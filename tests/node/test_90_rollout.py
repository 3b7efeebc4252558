"""The lab rollout (python -m deploys.rollout) on the sandbox's two clusters (deployment A's one node, the pair), with
the real pyinfra runs, the real vLLM and the real door: a stage that fails on one cluster switches nothing and halts;
`--resume` with the inventory fixed stages what is left, switches the canary (A) first and then the pair, gated; killed
while the pair switches, a second `--resume` switches the pair alone (A is not restarted), and its bake halts it on
an alert of the pair's (its worker's node-exporter stopped); a third, without a bake, ends it with no restart; the
ledger and the lab's standing say so, with each head's release bench. A release that answers right but slower fails
A's bench and halts a second rollout, A back on the release it served. `--abort` then puts both clusters back on the
releases they served before (the pair's worker first), which a plain converge of the same inventory holds to, and
the sandbox's own inventory converges without a restart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from datetime import datetime

import pytest

from deploys.ops import staged_path
from tests.node.conftest import INVENTORY, changed_operations, failure_excerpt, inventory_copy, on_node, pyinfra

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


def killed_mid_wave(inventory: str, state: str, node: str, wave_line: str) -> str:
    """Run `--resume` and SIGKILL its process group once it printed ``wave_line`` and ``node``'s service then runs
    another invocation (its wave has begun restarting it); what it printed until then. A restart of ``node`` before
    its wave began is the rollout's doing or not: either way it is told, with the unit's journal, as a warning."""
    proc = subprocess.Popen([sys.executable, "-m", "deploys.rollout", inventory, "--resume"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "XDG_STATE_HOME": state})
    printed = []
    reader = threading.Thread(target=lambda: printed.extend(proc.stdout), daemon=True)
    reader.start()
    invocation = lambda: on_node(node, f"systemctl show -P InvocationID {UNITS[node]}").stdout.strip()  # noqa: E731
    first, at_wave = invocation(), None
    deadline = time.monotonic() + 1200
    while time.monotonic() < deadline and proc.poll() is None:
        now = invocation()
        if at_wave is None and any(wave_line in line for line in printed):
            at_wave = now
            if at_wave != first:  # systemd's own lines about the pair's units say what stopped it, and when
                said = {n: on_node(n, f"journalctl -u {UNITS[n]} _PID=1 -n 12 --no-pager -o short-iso").stdout
                        for n in ("sandbox-b0", "sandbox-b1")}
                warnings.warn(f"{node}'s {UNITS[node]} restarted before its wave began ({first} -> {at_wave}); "
                              f"the rollout printed:\n{''.join(printed)[-4000:]}\n"
                              + "".join(f"systemd on {n}:\n{text}\n" for n, text in said.items()))
        if at_wave is not None and now not in (at_wave, ""):
            break
        time.sleep(2)
    assert proc.poll() is None, "the rollout ended before its wave restarted " + node + ":\n" + "".join(printed)[-3000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    reader.join(timeout=60)
    return "".join(printed)


def in_order(text: str, *lines: str) -> bool:
    """Every one of ``lines`` in ``text``, in this order."""
    at = [text.find(line) for line in lines]
    return -1 not in at and at == sorted(at)


def stop_when_switched(state: str, ledger_file: str, cluster: str, node: str, unit: str) -> None:
    """Stop ``unit`` on ``node`` once the ledger says ``cluster`` switched (its wave passed: the bake begins)."""
    path = os.path.join(state, "inference-nodes", "rollouts", ledger_file)
    deadline = time.monotonic() + 1200
    while time.monotonic() < deadline:
        with open(path) as f:
            if json.load(f)["clusters"][cluster]["state"] == "switched":
                on_node(node, f"systemctl stop {unit}")
                return
        time.sleep(1)


def test_a_rollout_stages_first_halts_on_a_failed_stage_resumes_canary_first_after_a_kill_and_aborts(sandbox, tmp_path):
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
    # ... and is killed (the control node's process group, pyinfra with it) once the pair's worker restarted in its wave
    killed = killed_mid_wave(broken, state, "sandbox-b1", "rollout: wave 1: switching gb10-dspark")
    assert in_order(killed, "rollout: staging gb10-dspark", "rollout: wave 0: switching rtx-pro-6000-pair",
                    "rollout: wave 1: switching gb10-dspark"), killed[-3000:]
    canary = started("sandbox-a")
    assert canary[0] != before["sandbox-a"][0]
    with open(os.path.join(state, "inference-nodes", "rollouts", ledger_file)) as f:
        ledger = json.load(f)
    assert {c: e["state"] for c, e in ledger["clusters"].items()} == {"rtx-pro-6000-pair": "switched",
                                                                      "gb10-dspark": "staged"}
    assert "--resume once the inventory is fixed" in rollout(broken, state).stderr  # unfinished: no fresh start
    # resumed with a bake: the pair's worker's node-exporter stops as the bake begins, NodeExporterDown fires for
    # the wave's cluster on the monitoring host's Prometheus, and the rollout halts with the pair on the new release
    exporter = "inference-nodes-node-exporter.service"
    stopper = threading.Thread(target=stop_when_switched,
                               args=(state, ledger_file, "gb10-dspark", "sandbox-b1", exporter))
    stopper.start()
    try:
        loud = rollout(broken, state, "--resume", "--bake-s", "40")
    finally:
        stopper.join(timeout=60)
        on_node("sandbox-b1", f"systemctl start {exporter}")
    assert loud.returncode == 1, loud.stdout[-4000:] + loud.stderr[-3000:]
    out = loud.stdout
    told = out[-2500:] + failure_excerpt(loud.stderr)  # (a switch that failed says why in pyinfra's words)
    assert "rollout: wave 0: switching gb10-dspark" in out and "switching rtx-pro-6000-pair" not in out, told
    assert "staging" not in out, told  # the pair was staged before the kill
    assert "halted: wave 0: alerts firing during the bake:" in out and "NodeExporterDown on sandbox-b1" in out, told
    assert started("sandbox-a") == canary, "the resume restarted a cluster the killed rollout had switched"
    pair = {n: started(n) for n in ("sandbox-b0", "sandbox-b1")}
    # the exporter back, a resume without a bake finds the pair on its release: nothing restarts, the rollout ends
    resumed = rollout(broken, state, "--resume")
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-3000:]
    after = {n: started(n) for n in UNITS}
    assert {n: after[n] for n in pair} == pair and after["sandbox-a"] == canary
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
    # each head benchmarked the release after its gate; its figures stand with the release
    assert all([b["concurrency"] for b in r["live"]["bench"]] == [1, 2] and all(b["output_tok_s"] > 0 and not b["failed"]
               for b in r["live"]["bench"]) for r in json.loads(standing.stdout)), standing.stdout

    # a release that answers right but slower (A's vLLM runs one sequence at a time, not two): its gate passes, its
    # bench does not (at concurrency 2 a request waits for the other); A goes back to the release it served, the
    # rollout halts, the pair is untouched
    os.mkdir(tmp_path / "slow")
    slow = inventory_copy(tmp_path / "slow", (a_env, a_env + ' "INFERENCE_NODES_DRILL": "rollout", "MAX_NUM_SEQS": "1",'),
                          (b_args, b_args + ' "--seed", "0",'))
    slower = rollout(slow, state, "--limit", "rtx-pro-6000-pair")
    assert slower.returncode == 1, slower.stdout[-3000:] + slower.stderr[-3000:]
    assert "halted: wave 0 failed on rtx-pro-6000-pair" in slower.stdout, slower.stdout[-3000:]
    assert "serves slower than the last good" in slower.stderr and "concurrency 2: TTFT p95" in slower.stderr, \
        slower.stderr[-3000:]
    assert started("sandbox-a")[0] != after["sandbox-a"][0]  # (switched, then rolled back)
    assert {n: started(n) for n in ("sandbox-b0", "sandbox-b1")} == {n: after[n] for n in ("sandbox-b0", "sandbox-b1")}
    standing = subprocess.run([sys.executable, "-m", "deploys.lab_status", broken, "--json"], capture_output=True,
                              text=True, timeout=120)
    assert standing.returncode == 0, standing.stdout  # A serves the release the first rollout switched it to
    after = {n: started(n) for n in UNITS}

    # --abort: every switched cluster back on the release it served before, the pair's worker first, gated
    aborted = rollout(broken, state, "--abort")
    assert aborted.returncode == 0, aborted.stdout[-4000:] + aborted.stderr[-3000:]
    [told] = [line for line in aborted.stdout.splitlines() if line.startswith("rollout: aborting: ")]
    assert "rtx-pro-6000-pair" in told and "gb10-dspark" in told and "back to the releases they served before" in told
    back = {n: started(n) for n in UNITS}
    assert all(back[n][0] != after[n][0] for n in UNITS), (after, back)
    assert back["sandbox-b1"][1] < back["sandbox-b0"][1], back  # the worker's rank starts before its head
    assert on_node("sandbox-a", f"grep -c INFERENCE_NODES_DRILL {live}").stdout.strip() == "0"
    with open(os.path.join(state, "inference-nodes", "rollouts", ledger_file)) as f:
        ledger = json.load(f)
    assert ledger["aborted"] and {e["state"] for e in ledger["clusters"].values()} == {"rolled back"}
    # the inventory still asks for the release left: held back by a plain converge, said so by lab_status
    standing = subprocess.run([sys.executable, "-m", "deploys.lab_status", broken, "--json"], capture_output=True,
                              text=True, timeout=120)
    assert standing.returncode == 1, standing.stdout
    assert {r["state"] for r in json.loads(standing.stdout)} == {"failed, rolled back"}, standing.stdout
    held = pyinfra(broken, "deploys/all.py", "--limit", "rtx-pro-6000-pair", check=False)
    assert held.returncode != 0 and "its switch was held back" in held.stderr, held.stderr[-3000:]
    again = pyinfra("--json", broken, "deploys/roll_back.py")  # nothing serves a release to leave: no change
    assert changed_operations(again) == [] and {n: started(n) for n in UNITS} == back
    assert rollout(broken, state, "--abort").returncode == 0  # (the ledger: nothing switched is left)
    # the releases restored are the sandbox's own: its inventory converges with no restart
    pyinfra(INVENTORY, "deploys/all.py")
    assert {n: started(n) for n in UNITS} == back

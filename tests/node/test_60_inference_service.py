"""The service on sandbox nodes: running and answering on loopback, untouched by a no-op converge (same
PID), restarted once by an env change, kept down by a corrupted shard, workers started before heads,
each fabric node with its own GID index from its sysfs, and back after a reboot with the gate in force."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from datetime import datetime

from tests.node.conftest import INVENTORY, changed_operations, on_node, pyinfra

PORTS = {"sandbox-a": 8101, "sandbox-b0": 8102, "sandbox-b1": 8103}
UNITS = {"sandbox-a": "grandpa.service", "sandbox-b0": "inference.service", "sandbox-b1": "inference.service"}


def main_pid(node: str) -> str:
    return on_node(node, f"systemctl show -p MainPID --value {UNITS[node]}").stdout.strip()


def models(node: str) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{PORTS[node]}/v1/models", timeout=5) as r:
        return [m["id"] for m in json.load(r)["data"]]


def test_services_answer_on_loopback_only(sandbox):
    for node in sandbox:
        assert on_node(node, f"systemctl is-active {UNITS[node]}").stdout.strip() == "active"
        listen = on_node(node, f"ss -Hltn 'sport = :{PORTS[node]}'").stdout.split()
        assert f"127.0.0.1:{PORTS[node]}" in listen and f"0.0.0.0:{PORTS[node]}" not in listen
    assert models("sandbox-a") == ["grandpa"]


def test_each_fabric_node_reads_its_own_gid_index(sandbox):
    indices = {n: on_node(n, "cat /run/inference-nodes/roce.env").stdout for n in ("sandbox-b0", "sandbox-b1")}
    assert "NCCL_IB_GID_INDEX=4" in indices["sandbox-b0"] and "NCCL_IB_GID_INDEX=5" in indices["sandbox-b1"]


def test_noop_converge_keeps_the_same_process_and_an_env_change_restarts_once(sandbox):
    before = {n: main_pid(n) for n in sandbox}
    assert changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py")) == []
    assert {n: main_pid(n) for n in sandbox} == before
    env = ["--limit", "sandbox-b0", "--data", 'service_env={"VLLM_USE_BREAKABLE_CUDAGRAPH": "1"}']
    changed = dict(changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py", *env)))
    assert changed["Inference service | Start or update heads and single nodes"] == ["sandbox-b0"]
    restarted = main_pid("sandbox-b0")
    assert restarted != before["sandbox-b0"]
    assert changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py", *env)) == []
    assert main_pid("sandbox-b0") == restarted
    pyinfra(INVENTORY, "deploys/all.py", "--limit", "sandbox-b0")  # back to the inventory's env


def test_workers_start_before_heads(sandbox):
    for node in ("sandbox-b0", "sandbox-b1"):
        assert on_node(node, f"systemctl stop {UNITS[node]}").returncode == 0
    pyinfra(INVENTORY, "deploys/all.py")
    started = {}
    for n in ("sandbox-b0", "sandbox-b1"):  # wall-clock start times (the nodes share this machine's clock)
        out = on_node(n, f"systemctl show --timestamp=us+utc -p ExecMainStartTimestamp --value {UNITS[n]}").stdout
        started[n] = datetime.strptime(out.strip(), "%a %Y-%m-%d %H:%M:%S.%f %Z")
    assert started["sandbox-b1"] < started["sandbox-b0"], started


def test_corrupted_shard_keeps_the_service_down_until_repaired(sandbox):
    node = "sandbox-b1"
    on_node(node, "printf 'XXXX' | dd of=/srv/models/DeepSeek-V4-Flash-0731/model-00001-of-00004.safetensors "
                  "bs=1 seek=64 conv=notrunc 2>/dev/null")
    assert on_node(node, f"systemctl restart {UNITS[node]}").returncode != 0
    assert on_node(node, f"systemctl is-active {UNITS[node]}").stdout.strip() != "active"
    journal = on_node(node, f"journalctl -u {UNITS[node]} --no-pager -n 30").stdout
    assert "changed since it was verified" in journal
    changed = [name for name, _ in changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py", "--limit", node))]
    assert "Model snapshot | Sync and verify the model snapshot" in changed
    assert on_node(node, f"systemctl is-active {UNITS[node]}").stdout.strip() == "active"


def test_serving_gate_passes_heads_and_fails_a_garbage_server(sandbox):
    gate = [sys.executable, "-m", "pytest", "-q", "-rf", "tests/audit", "--inventory", INVENTORY, "-m", "serving"]
    good = subprocess.run(gate, capture_output=True, text=True, timeout=300)
    assert good.returncode == 0 and "2 passed" in good.stdout, good.stdout[-3000:]
    garbage = ["--limit", "sandbox-b0", "--data", 'service_env={"STANDIN_MODE": "garbage"}']
    pyinfra(INVENTORY, "deploys/all.py", *garbage)  # HTTP 200 with nonsense from now on
    bad = subprocess.run([*gate, "--limit", "sandbox-b0"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1
    assert "sandbox-b0: coherence: answer:" in bad.stdout and "tool_round_trip" in bad.stdout
    pyinfra(INVENTORY, "deploys/all.py", "--limit", "sandbox-b0")  # back to the inventory's env
    assert subprocess.run([*gate, "--limit", "sandbox-b0"], capture_output=True, text=True).returncode == 0


def test_service_back_after_a_reboot_with_the_gate_in_force(sandbox):
    node = "sandbox-a"
    pyinfra(INVENTORY, "server.reboot", "delay=5", "interval=1", "reboot_timeout=120", "--limit", node)
    on_node(node, f"systemctl is-active --wait {UNITS[node]} || sleep 3")
    assert on_node(node, f"systemctl is-active {UNITS[node]}").stdout.strip() == "active"
    journal = on_node(node, f"journalctl -b -u {UNITS[node]} --no-pager").stdout
    assert "verified against sha256:" in journal  # the gate ran at boot
    assert models(node) == ["grandpa"]
    assert changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py")) == []

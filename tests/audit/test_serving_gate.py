"""The serving gate against each cluster's head: answers coherently, not just HTTP 200 (health, served
name, Paris, tool call round trip, strict JSON, usage.completion_tokens, the generation counter), plus the
qualification gates its profile selects (deploys/schema/gate.py GateKeys): the concurrency proof, the KV capacity
the startup log reports, and (with --qualify, since it restarts the service) restart and post-restart smoke.

Runs on the node (the API stays on loopback): `pytest tests/audit -m serving [--qualify]`.
"""

import json
import os
import shlex

import pytest

from deploys.inference_service import served_model_name
from deploys.serving_gate import api_url, gate_options, node_script, startup_log_command
from files.serving_gate.kv_capacity import kv_capacity, kv_capacity_problems

pytestmark = pytest.mark.serving
READY_TIMEOUT_S = int(os.environ.get("SERVING_READY_TIMEOUT_S", "900"))


def run_gate(node, *options: str) -> tuple[list[dict], str]:
    """The gate script run on the head against its loopback API: its checks, and its stderr."""
    argv = shlex.join([api_url(node.cfg), served_model_name(node.cfg), *options])
    result = node.host.run(node_script(f"python3 \"$d/serving_gate.py\" {argv}\n"))
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")], result.stderr.strip()


def assert_passed(node, checks: list[dict], stderr: str) -> None:
    failed = [f"{c['check']}: {c['detail']}" for c in checks if not c["ok"]]
    assert checks and not failed, f"{node.name}: " + "; ".join(failed or [stderr])


def test_serving_gate(node, head_only):
    # a real vLLM loads and compiles before it answers: the gate waits for /health (the start timeout bounds it)
    assert_passed(node, *run_gate(node, "--wait", str(READY_TIMEOUT_S), *gate_options(node.cfg)))


def test_kv_capacity(node, head_only):
    """The startup log's `GPU KV cache size` and `Maximum concurrency` against the profile's minimums."""
    cfg = node.cfg
    if cfg.gate_kv_cache_min_tokens is None and cfg.gate_kv_min_concurrency is None:
        pytest.skip(f"{node.name}: its profile sets no gate_kv_cache_min_tokens / gate_kv_min_concurrency")
    assert_passed(node, *run_gate(node, "--wait", str(READY_TIMEOUT_S), "--ready-only"))  # the log is written
    log = node.host.run(startup_log_command(cfg)).stdout
    problems = kv_capacity_problems(kv_capacity(log), cfg.gate_kv_cache_min_tokens, cfg.gate_kv_min_concurrency)
    assert not problems, f"{node.name}: {cfg.container_name}.service: " + "; ".join(problems)


def test_restart_and_post_restart_smoke(node, head_only, cluster_members, pytestconfig):
    """Restart the cluster's services, workers before the head (as the deploy starts them), wait for
    /health and rerun the smoke requests."""
    if not node.cfg.gate_restart:
        pytest.skip(f"{node.name}: its profile does not select gate_restart")
    if not pytestconfig.getoption("qualify"):
        pytest.skip("restarts the service: only with --qualify")
    members = cluster_members(node)

    def invocation(m):
        return m.host.run(f"systemctl show -p InvocationID --value {m.cfg.container_name}.service").stdout.strip()

    before = {m.name: invocation(m) for m in members}
    for m in members:
        restarted = m.host.run(f"systemctl restart {m.cfg.container_name}.service")
        assert restarted.rc == 0, f"{m.name}: systemctl restart failed: {restarted.stderr.strip()}"
    same = [m.name for m in members if invocation(m) == before[m.name]]
    assert not same, f"not restarted: {same}"
    assert_passed(node, *run_gate(node, "--wait", str(READY_TIMEOUT_S)))

"""The serving gate against each cluster's head: answers coherently, not just HTTP 200 (health, served
name, Paris, tool call round trip, strict JSON, usage.completion_tokens, the generation counter): the smoke,
`pytest tests/audit -m serving`, the same checks a converge runs after a start. The load-bearing gates its
profile selects (deploys/schema/gate.py GateKeys) need a drained node, `-m drained`: the concurrency proof (takes
the head's slots), the KV capacity the startup log reports, and (with --qualify, since it restarts the service)
restart and post-restart smoke. Runs on the node (the API stays on loopback). Each check waits for the one
readiness read of its head (conftest.py `serving_node`): a service that is down fails at once.
"""

import pytest

from deploys.service.unit import served_model_name
from deploys.serving_gate import gate_checks, gate_command, gate_options, startup_log_command, wait_serving
from files.serving_gate.kv_capacity import kv_capacity, kv_capacity_problems



def run_gate(node, *options: str) -> tuple[list[dict], str]:
    """The gate script run on the head against its loopback API: its checks, and its stderr."""
    result = node.host.run(gate_command(node.cfg, served_model_name(node.cfg), *options))
    return gate_checks(result.stdout), result.stderr.strip()


def assert_passed(node, checks: list[dict], stderr: str) -> None:
    failed = [f"{c['check']}: {c['detail']}" for c in checks if not c["ok"]]
    assert checks and not failed, f"{node.name}: " + "; ".join(failed or [stderr])


@pytest.mark.serving
def test_serving_gate(serving_node, head_only):
    """The smoke: one request of each kind (safe beside users' requests)."""
    assert_passed(serving_node, *run_gate(serving_node))


@pytest.mark.drained
def test_concurrency_proof(serving_node, head_only):
    """K requests at once, all scheduled together: takes the head's slots (`gate_concurrency`)."""
    if not serving_node.cfg.gate_concurrency:
        pytest.skip(f"{serving_node.name}: its profile sets no gate_concurrency")
    assert_passed(serving_node, *run_gate(serving_node, *gate_options(serving_node.cfg)))


@pytest.mark.drained
def test_kv_capacity(serving_node, head_only):
    """The startup log's `GPU KV cache size` and `Maximum concurrency` against the profile's minimums."""
    node, cfg = serving_node, serving_node.cfg
    if cfg.gate_kv_cache_min_tokens is None and cfg.gate_kv_min_concurrency is None:
        pytest.skip(f"{node.name}: its profile sets no gate_kv_cache_min_tokens / gate_kv_min_concurrency")
    log = node.host.run(startup_log_command(cfg)).stdout
    problems = kv_capacity_problems(kv_capacity(log), cfg.gate_kv_cache_min_tokens, cfg.gate_kv_min_concurrency)
    assert not problems, f"{node.name}: {cfg.container_name}.service: " + "; ".join(problems)


@pytest.mark.drained
def test_restart_and_post_restart_smoke(serving_node, head_only, cluster_members, pytestconfig):
    """Restart the cluster's services, workers before the head (as the deploy starts them), wait for
    /health and rerun the smoke requests."""
    node = serving_node
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
    ok, why, _ = wait_serving(lambda c: node.host.run(c).stdout, node.cfg, True, node.cfg.service_ready_timeout_sec)
    assert ok, f"{node.name}: {why}"
    assert_passed(node, *run_gate(node))

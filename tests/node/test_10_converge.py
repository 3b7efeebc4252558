"""converge -> bad input changes nothing -> converge -> zero changes -> reboot -> audit (-> drift caught).

The tests in this module run in order and share the session's nodes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import urllib.parse
import urllib.request

import pytest

from deploys.service.unit import served_model_name
from deploys.inventory import inventory_configs, load_inventory
from tests.node.conftest import INVENTORY, changed_operations, on_node, pyinfra, wait_serving

LIMITS_FILE = "/etc/security/limits.d/90-inference-nodes.conf"
# a no-op converge: preflight's facts, every other component's expected facts, the snapshot verifier's verdict
NOOP_COMMANDS_PER_NODE = 3


def _untouched(nodes):
    for name in nodes:
        assert on_node(name, f"test ! -e {LIMITS_FILE}").returncode == 0, f"{name} was changed"


def test_bad_inventory_value_stops_the_run_and_names_host_and_key(sandbox):
    proc = pyinfra(INVENTORY, "deploys/all.py", "--data", 'model_revision="main"', check=False)
    assert proc.returncode == 1
    for name in sandbox:
        assert f"host {name}: key 'model_revision' = 'main': expected a 40-hex commit id" in proc.stderr
    assert "nothing was changed on any host" in proc.stderr
    _untouched(sandbox)


def test_preflight_refuses_a_host_that_cannot_run_the_profile(sandbox):
    proc = pyinfra(INVENTORY, "deploys/all.py", "--data", "model_size_gb=90000", check=False)
    assert proc.returncode == 1
    assert "Preflight:" in proc.stderr and "Podman" in proc.stderr  # the table was printed
    for name in sandbox:
        assert f"host {name}: too little disk for the model at " in proc.stderr
    for name, cluster in (("sandbox-a", "rtx-pro-6000-pair"), ("sandbox-b0", "gb10-dspark"), ("sandbox-b1", "gb10-dspark")):
        assert f"{name}: preflight failed for cluster {cluster}; nothing was changed on its members:" in proc.stderr
    _untouched(sandbox)


@pytest.mark.lifecycle
@pytest.mark.endpoint
@pytest.mark.monitoring
@pytest.mark.model
@pytest.mark.pair
def test_converge(sandbox):
    proc = pyinfra("--json", INVENTORY, "deploys/all.py")
    changed = dict(changed_operations(proc))
    assert sorted(changed["Host tuning | Set memlock/nofile/stack limits for logins (limits.d)"]) == sorted(sandbox)
    # done means serving: the run ended once each head passed the serving gate (a worker, started a moment before
    # by its own step, already runs what was rendered when this step comes to it: nothing to wait for)
    assert {"sandbox-a", "sandbox-b0"} <= set(changed["Inference service | Wait until it serves (heads: /health and the serving gate)"])
    for port in (8101, 8102):  # sandbox-a, sandbox-b0: no wait here, the converge did it
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            assert r.status == 200
    # long steps print their progress as they go, without -v: the model's copy (bytes, rate; the sandbox's push
    # mode: from the control node or a peer) and its full re-hash, on every node; the wait for vLLM, its stage
    for node in sandbox:
        assert re.search(rf"\[{node}\] +model sync from [^:]+(:[0-9]+)?: [0-9.]+ of [0-9.]+ [GM]B, [0-9.]+ MB/s, "
                         r"[0-9]+ s \(done\)", proc.stderr), proc.stderr[-3000:]
        assert re.search(rf"\[{node}\] +verify: [0-9.]+/[0-9.]+ GB hashed", proc.stderr), proc.stderr[-3000:]
    assert re.search(r"\[sandbox-a\] +waiting for grandpa.service: [0-9]+ s, ", proc.stderr), proc.stderr[-3000:]
    # a first converge pages nobody: Prometheus (up since the run's start, on sandbox-a) learnt of each node only
    # once the run had set up its metrics, so no alert about a node fired while the nodes were being deployed (the
    # alerting path's own may: no receiver listens during the node tests)
    from deploys.monitoring.rules import ALERTING_PATH

    query = ('max_over_time(ALERTS{alertstate="firing",alertname!~"Watchdog|%s"}[1h])' % "|".join(ALERTING_PATH))
    with urllib.request.urlopen("http://127.0.0.1:9190/api/v1/query?" + urllib.parse.urlencode({"query": query}),
                                timeout=10) as r:
        fired = json.load(r)["data"]["result"]
    assert fired == [], [f["metric"] for f in fired]


@contextlib.contextmanager
def connected_state():
    """A pyinfra State connected to every sandbox node, as deploys/all.py's run connects (same hooks)."""
    import runpy

    import deploys  # noqa: F401  (what deploys/all.py imports: the fact cache)
    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.connect import connect_all

    groups = {k: v for k, v in runpy.run_path(INVENTORY).items() if not k.startswith("_") and isinstance(v, list)}
    hosts = {h[0]: h for members in groups.values() for h in members}  # a cluster's group repeats its group's hosts
    state = State(Inventory((list(hosts.values()), {})), Config())
    connect_all(state)
    try:
        yield state
    finally:
        for h in state.inventory:
            h.disconnect()


def test_ssh_to_every_node_sends_each_message_at_once(sandbox):
    """deploys/run/ssh_nodelay.py on the real connections a run makes (deploys/all.py calls it once pyinfra has
    connected): without TCP_NODELAY every command waits for the node's delayed ACK (48 ms against 4.8 ms a
    command on loopback). A host that connects later gets it from pyinfra's own connection callback."""
    import socket

    from deploys.run.ssh_nodelay import install

    def nagle_off(h) -> bool:
        return bool(h.connector.client.get_transport().sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    with connected_state() as state:
        hosts = list(state.inventory)
        assert sorted(h.name for h in hosts) == sorted(sandbox)
        assert not any(nagle_off(h) for h in hosts), "paramiko's default changed: the test shows nothing"
        late = hosts[-1]
        late.disconnect()
        install(state)
        for h in hosts[:-1]:
            assert nagle_off(h), f"{h.name}: Nagle still on"
            assert h.run_shell_command("true")[0], h.name
        late.connect()
        assert nagle_off(late), f"{late.name}: connected after install, Nagle still on"


def test_unit_reads_answered_together_are_what_pyinfra_reads_for_each(sandbox):
    """facts/batch.py answers every SystemdStatus/SystemdEnabled read of a batch from one
    `systemctl show`; on a real node each answer equals pyinfra's own read of that unit list (an alias, a
    unit that does not exist, a unit named twice, two units in one read), and it is one command."""
    from pyinfra.api.facts import get_fact
    from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

    from facts.batch import FactBatch, Reads, read_key
    from facts.host import ManagedFiles

    unit_lists = [["ssh.service"], ["sshd.service"], ["no-such-unit.service"], ["inference-nodes-model-verify.timer"],
                  ["ssh.service", "inference-nodes-model-verify.timer"], "systemd-journald.service"]
    reads = [(cls, {"services": units}) for units in unit_lists for cls in (SystemdStatus, SystemdEnabled)]
    reads.append((ManagedFiles, {"paths": ("/etc/hostname",)}))
    with connected_state() as state:
        host = state.inventory.get_host("sandbox-a")
        expected = [get_fact(state, host, cls, args=(), kwargs=kw) for cls, kw in reads]  # pyinfra, uncached
        assert expected[0] == {"ssh.service": True} and expected[5] == {"no-such-unit.service": False}, expected
        calls = []
        run = host.run_shell_command
        host.run_shell_command = lambda *a, **kw: calls.append(a) or run(*a, **kw)
        answers = get_fact(state, host, FactBatch, args=(), kwargs={"reads": Reads(reads)})
        assert len(calls) == 1
        assert [answers[read_key(cls, kw)] for cls, kw in reads] == expected


@pytest.mark.lifecycle  # a change to any step's reads shows here first
def test_second_converge_reports_zero_changes_in_a_few_commands_per_node(sandbox, tmp_path):
    """Zero changes; and each node's facts came in a few commands (the ones each component expects, read
    together: deploys/run/reads.py), not one round trip per fact (51 before). Counted by the bench's
    wrapper of the same CLI (bench/pyinfra_counted.py)."""
    counts = tmp_path / "counts.json"
    proc = subprocess.run([sys.executable, "bench/pyinfra_counted.py", str(counts), "-y", "--json", INVENTORY,
                           "deploys/all.py"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert changed_operations(proc) == []
    per_host = json.loads(counts.read_text())
    commands = json.loads((tmp_path / "counts.json.commands").read_text())
    assert sorted(per_host) == sorted(sandbox)
    for name, count in per_host.items():
        ran = "\n".join(f"  {c[:160]}" for _, c in commands[name])
        assert count["commands"] <= NOOP_COMMANDS_PER_NODE, f"{name} ran {count['commands']} commands:\n{ran}"


def test_one_unfit_node_fails_its_cluster_and_the_other_clusters_converge(sandbox, tmp_path):
    """sandbox-a unfit (its model cannot fit its disk): its cluster fails at the run's first step, before anything
    changes on it, naming the host and why; the pair's cluster converges (to zero changes: it is converged)."""
    from tests.node.conftest import inventory_copy

    unfit = inventory_copy(tmp_path, ('_node("sandbox-a", 2201, ', '_node("sandbox-a", 2201, model_size_gb=90000, '))
    proc = pyinfra("--json", unfit, "deploys/all.py", check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert ("sandbox-a: preflight failed for cluster rtx-pro-6000-pair; nothing was changed on its members:\n"
            "  - host sandbox-a: too little disk for the model at ") in proc.stderr, proc.stderr[-3000:]
    results = json.loads(proc.stdout)["results"]
    assert results["failed_hosts"] == ["sandbox-a"], results["failed_hosts"]
    changed = [op["name"] for op in results["operations"] if op["success"]]
    assert changed == [], changed
    # the pair ran every step, to the last one; sandbox-a failed at the first (pyinfra lists a failed host in the
    # error column of every operation after its failure)
    last = [op for op in results["operations"] if "sandbox-b0" in op["no_change"]][-1]  # the pair's last step
    assert last is results["operations"][-1] and last["no_change"] == ["sandbox-b0", "sandbox-b1"], last
    assert results["operations"][-1]["error"] == ["sandbox-a"], results["operations"][-1]
    first = next(op for op in results["operations"] if op["name"].endswith("every member of this cluster can run it"))
    assert first["error"] == ["sandbox-a"] and first["no_change"] == ["sandbox-b0", "sandbox-b1"], first


def test_host_wide_limits_off_leave_the_service_its_own(sandbox, tmp_path):
    """The lab's default: no limits for logins or as systemd's defaults (files an earlier run wrote go, no
    re-exec of PID 1); the service keeps its own and is not restarted; the audit checks they are gone. Back on,
    they come back."""
    from tests.node.conftest import inventory_copy

    node, files = "sandbox-a", (LIMITS_FILE, "/etc/systemd/system.conf.d/90-inference-nodes.conf")
    off = inventory_copy(tmp_path, ('_node("sandbox-a", 2201, ', '_node("sandbox-a", 2201, limits_host_wide=False, '))
    started = on_node(node, "systemctl show -p InvocationID --value grandpa.service").stdout
    removed = changed_operations(pyinfra("--json", off, "deploys/all.py", "--limit", node))
    assert sorted(op for op, _ in removed) == ["Host tuning | Remove systemd's default limits (limits_host_wide is off)",
                                               "Host tuning | Remove the login limits (limits.d; limits_host_wide is off)"]
    assert all(on_node(node, f"test ! -e {f}").returncode == 0 for f in files)
    own = on_node(node, "systemctl show -p LimitNOFILE -p LimitMEMLOCK --value grandpa.service").stdout.split()
    assert sorted(own) == ["20000", "8388608"], own  # the unit's own (the sandbox's caps)
    assert on_node(node, "systemctl show -p InvocationID --value grandpa.service").stdout == started, "not restarted"
    audit = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "tests/audit/test_host_tuning.py", "--inventory",
                            off, "--limit", node, "-p", "no:cacheprovider"], capture_output=True, text=True, timeout=300)
    assert audit.returncode == 0 and "PASSED tests/audit/test_host_tuning.py::test_host_wide_limits_are_absent_when_off" \
        in audit.stdout, audit.stdout[-3000:]
    back = changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py", "--limit", node))
    assert "Host tuning | Set memlock/nofile/stack limits for logins (limits.d)" in dict(back)
    assert changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py", "--limit", node)) == []


def test_audit_after_reboot(sandbox):
    """Every node back at boot with no converge: each service started behind the model gate (verified at this boot),
    the heads serve their model, the audit passes, and a converge afterwards changes nothing."""
    pyinfra(INVENTORY, "server.reboot", "delay=5", "interval=1", "reboot_timeout=120")
    wait_serving(sandbox)  # the services start at boot, behind the model gate, and load before they answer
    configs = inventory_configs(load_inventory(INVENTORY))
    for node in sandbox:
        service = f"{configs[node].container_name}.service"
        assert on_node(node, f"systemctl is-active {service}").stdout.strip() == "active", node
        journal = on_node(node, f"journalctl -b -u {service} --no-pager").stdout
        assert "verified against sha256:" in journal, f"{node}: the model gate did not run at boot:\n{journal[-2000:]}"
        if configs[node].node_rank == 0:
            with urllib.request.urlopen(f"http://127.0.0.1:{configs[node].api_port}/v1/models", timeout=10) as r:
                assert [m["id"] for m in json.load(r)["data"]] == [served_model_name(configs[node])], node
    proc = _audit()
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout
    assert changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py")) == []


def test_audit_catches_drift_and_converge_repairs_it(sandbox):
    node = sandbox[-1]
    assert on_node(node, f"sed -i -E 's/(nofile\\s+)[0-9]+/\\14096/' {LIMITS_FILE}; echo UCX_TLS=tcp >> /etc/inference-nodes/fabric.env").returncode == 0
    proc = _audit()
    assert proc.returncode == 1
    assert f"test_limits_d_raises_memlock_nofile_stack_for_users_and_root[{node}]" in proc.stdout
    assert f"test_fabric_env_file[{node}]" in proc.stdout
    changed = changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py"))
    # the fabric env is staged and goes in place at once: the service does not restart (it started from the
    # rendered files; the drift was never applied)
    assert changed == [("Host tuning | Set memlock/nofile/stack limits for logins (limits.d)", [node]),
                       ("Host tuning | Stage the UCX/NCCL fabric environment (0600, never printed)", [node]),
                       ("Inference service | Put the unit and environment in place (now, or at the restart once the "
                        "door closed)", [node])], changed
    _close_audit_connections()  # login limits apply at login: the drifted ones would stay on a reused connection
    assert _audit().returncode == 0


def _close_audit_connections() -> None:
    """End the audit's shared SSH connections (tests/audit/conftest.py ControlPath ~/.ssh/cm-audit-%C)."""
    import glob

    for socket in glob.glob(os.path.expanduser("~/.ssh/cm-audit-*")):
        subprocess.run(["ssh", "-o", f"ControlPath={socket}", "-O", "exit", "audit"], capture_output=True, timeout=30)


def _audit() -> subprocess.CompletedProcess:
    env = {**os.environ, "AUDIT_INVENTORY": INVENTORY}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "tests/audit"], capture_output=True,
                          text=True, env=env, timeout=300)

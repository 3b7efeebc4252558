"""Resilience on sandbox nodes: a deploy killed at a random point, then rerun, converges and leaves no
half-written managed file in place; an unreachable node fails alone, named, while the others finish."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time

import pytest
import requests

from tests.node.conftest import INVENTORY, PYINFRA, changed_operations, inventory_copy, on_node, pyinfra, wait_serving

# in the order a converge writes them (driver, container runtime, host tuning, model snapshot)
MANAGED = [
    "/etc/apt/preferences.d/90-inference-nodes-nvidia-driver",
    "/etc/nvidia-container-toolkit/nvidia-cdi-refresh.env",
    "/etc/security/limits.d/90-inference-nodes.conf",
    "/etc/systemd/system.conf.d/90-inference-nodes.conf",
    "/etc/inference-nodes/fabric.env",
    "/etc/inference-nodes/model-manifest.json",
]


def _contents(node: str) -> dict[str, str | None]:
    out = {}
    for path in MANAGED:
        proc = on_node(node, f"cat {path}")
        out[path] = proc.stdout if proc.returncode == 0 else None
    return out


def test_killed_deploy_then_rerun_leaves_no_half_written_file(sandbox):
    for node in sandbox:
        assert on_node(node, "rm -f " + " ".join(MANAGED)).returncode == 0
    # killed somewhere among the file writes: as soon as a randomly chosen one (not the last) shows up on a
    # node, decided from the nodes' state rather than a delay (a converge's length changes with the code)
    mark = random.choice(MANAGED[:-1])
    proc = subprocess.Popen([PYINFRA, "-y", INVENTORY, "deploys/all.py"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while not any(on_node(node, f"test -e {mark}").returncode == 0 for node in sandbox):
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before it wrote {mark}"
        assert time.monotonic() < deadline, f"no node got {mark} within 300 s"
    with contextlib.suppress(ProcessLookupError):  # ended just now: said below
        os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, f"the run ended before {mark} was seen and it could be killed"
    after_kill = {node: _contents(node) for node in sandbox}
    # a command the killed run started on a node (an apt update, say) may still hold its lock for a moment
    pyinfra("--retry", "3", "--retry-delay", "5", INVENTORY, "deploys/all.py")
    for node in sandbox:
        converged = _contents(node)
        for path in MANAGED:
            # each file is absent or complete: never a prefix of the converged content
            assert after_kill[node][path] in (None, converged[path]), f"{node}:{path} half-written"
        assert on_node(node, "find /etc /usr/local -name '*.inference-nodes-tmp' | wc -l").stdout.strip() == "0"
    assert changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py")) == []


def test_a_run_killed_between_writing_a_unit_and_reloading_systemd_is_completed_by_the_next(sandbox):
    """The follow-up is decided from systemd's own state (NeedDaemonReload), not from the write's change."""
    node, timer = "sandbox-a", "/etc/systemd/system/inference-nodes-model-verify.timer"
    rendered = on_node(node, f"cat {timer}").stdout
    other = rendered.replace("OnCalendar=Sun *-*-* 03:00:00", "OnCalendar=Mon *-*-* 05:00:00")
    assert other != rendered
    assert on_node(node, f"printf %s {shlex.quote(other)} > {timer} && systemctl daemon-reload").returncode == 0
    # the killed run: the rendered file is back on disk, systemd was never told
    assert on_node(node, f"printf %s {shlex.quote(rendered)} > {timer}").returncode == 0
    calendar = "systemctl show -p TimersCalendar --value inference-nodes-model-verify.timer"
    assert "Mon" in on_node(node, calendar).stdout
    changed = changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py", "--limit", node))
    assert changed == [("Model integrity | Load the deep verify units", [node])], changed
    assert "Sun" in on_node(node, calendar).stdout


def test_a_run_killed_between_writing_systemd_defaults_and_the_reexec_is_completed_by_the_next(sandbox):
    """The re-exec is decided from systemd's manager state (`systemctl show`), not from the drop-in's change."""
    node, dropin = "sandbox-a", "/etc/systemd/system.conf.d/90-inference-nodes.conf"
    shown = "systemctl show -p DefaultLimitNOFILE --value"
    pyinfra(INVENTORY, "deploys/all.py", "--limit", node)  # converged (a no-op in module order)
    rendered = on_node(node, f"cat {dropin}").stdout
    want = next(line.split("=", 1)[1] for line in rendered.splitlines() if line.startswith("DefaultLimitNOFILE="))
    assert on_node(node, shown).stdout.strip() == want
    other = rendered.replace(f"DefaultLimitNOFILE={want}", f"DefaultLimitNOFILE={int(want) // 2}")
    assert on_node(node, f"printf %s {shlex.quote(other)} > {dropin} && systemctl daemon-reexec").returncode == 0
    # the killed run: the rendered drop-in is back on disk, systemd was never re-executed
    assert on_node(node, f"printf %s {shlex.quote(rendered)} > {dropin}").returncode == 0
    assert on_node(node, shown).stdout.strip() == str(int(want) // 2)
    changed = changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py", "--limit", node))
    assert changed == [("Host tuning | Re-execute systemd so the new default limits apply", [node])], changed
    assert on_node(node, shown).stdout.strip() == want
    assert changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py", "--limit", node)) == []


def test_unreachable_node_fails_alone_and_the_others_finish(sandbox, tmp_path):
    # the same inventory, but one node's ssh port points nowhere
    broken = inventory_copy(tmp_path, ('_node("sandbox-b1", 2203', '_node("sandbox-b1", 2299'))
    for node in sandbox:
        on_node(node, "rm -f /etc/security/limits.d/90-inference-nodes.conf")
    proc = pyinfra("--json", broken, "deploys/all.py", check=False)
    assert proc.returncode == 1
    assert "[sandbox-b1] Could not connect" in proc.stderr
    results = json.loads(proc.stdout)["results"]
    limits_op = next(o for o in results["operations"]
                     if o["name"] == "Host tuning | Set memlock/nofile/stack limits for logins (limits.d)")
    assert sorted(limits_op["success"]) == ["sandbox-a", "sandbox-b0"]
    assert on_node("sandbox-b1", "test -e /etc/security/limits.d/90-inference-nodes.conf").returncode == 1
    pyinfra(INVENTORY, "deploys/all.py")
    assert changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py")) == []


@pytest.mark.monitoring
def test_add_a_node_drill(sandbox, tmp_path):
    """One more inventory entry, then preflight and deploy with --limit for it alone: the others see zero
    changes but the monitoring host's scrape configuration, which the next full run brings the new node's target
    into (no hand edit), and the audit is green for all (the new node is a one-node cluster of deployment A's
    profile). Afterwards the monitoring host is converged back to the sandbox's own inventory."""
    inventory = inventory_copy(tmp_path)
    with open(inventory, "a") as f:
        f.write('\nrtx_pro_6000_pair = rtx_pro_6000_pair + [_node("sandbox-a2", 2204, api_port=8104, '
                       'cluster_name="rtx-pro-6000-pair-2", service_env=_A_ENV, **_manifest(_A), '
                       'endpoint_enabled=False, **_monitoring("127.0.0.4", 9204))]\n')  # (an endpoint would need an address of its own)
    try:
        up = subprocess.run(["tests/sandbox/node.sh", "up", "sandbox-a2", "2204", "2"], capture_output=True, text=True)
        assert up.returncode == 0, up.stderr
        pre = pyinfra(inventory, "deploys.preflight.preflight", "--limit", "sandbox-a2")
        assert "sandbox-a2  rtx-pro-6000-pair-2/0" in pre.stderr
        pyinfra(inventory, "deploys/all.py", "--limit", "sandbox-a2")
        changed = changed_operations(pyinfra("--json", inventory, "deploys/all.py"))
        # the new node joins Prometheus at the run's end, once its metrics are set up (they are: the limited run)
        assert changed == [("Monitoring host | Add the scrape targets of sandbox-a2 (their metrics set up by this run)",
                            ["sandbox-a"]),
                           ("Monitoring host | Record the nodes Prometheus scrapes", ["sandbox-a"]),
                           ("Monitoring host | Reload Prometheus after a change of targets or rules (promtool checks them first)",
                            ["sandbox-a"])], changed
        assert changed_operations(pyinfra("--json", inventory, "deploys/all.py")) == []
        seen = []
        for _ in range(30):  # the reload returns once Prometheus has the signal; it applies the file a moment later
            targets = requests.get("http://127.0.0.1:9190/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
            seen = [{k: t["labels"].get(k) for k in ("host", "job")} for t in targets]
            if {"host": "sandbox-a2", "job": "node"} in seen:
                break
            time.sleep(1)
        assert {"host": "sandbox-a2", "job": "node"} in seen, seen
        wait_serving(["sandbox-a2"], inventory=inventory)  # its real vLLM loads before it listens
        audit = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/audit", "--inventory", inventory],
                               capture_output=True, text=True, timeout=300)
        assert audit.returncode == 0, audit.stdout[-3000:]
        assert "failed" not in audit.stdout
    finally:
        subprocess.run(["tests/sandbox/node.sh", "down", "sandbox-a2"], capture_output=True)
        pyinfra(INVENTORY, "deploys/all.py", "--limit", "sandbox-a", check=False)  # its target out of Prometheus again


def test_bad_value_is_reported_even_when_every_node_is_unreachable(sandbox, tmp_path):
    """Validation runs before pyinfra connects (config.py): with every SSH port pointing nowhere, the bad
    value is still what the run reports, and no host is even tried."""
    broken = inventory_copy(tmp_path, *((f", {port},", f", {port + 97},") for port in (2201, 2202, 2203)))
    proc = pyinfra(broken, "deploys/all.py",
                   "--data", 'model_revision="main"', check=False)
    assert proc.returncode == 1
    for node in sandbox:
        assert f"host {node}: key 'model_revision' = 'main': expected a 40-hex commit id" in proc.stderr
    assert "Could not connect" not in proc.stderr and "Traceback" not in proc.stderr


def test_preflight_refuses_a_fabric_address_the_node_does_not_have(sandbox, tmp_path):
    wrong = inventory_copy(tmp_path, ('fabric_address="127.0.1.11"', 'fabric_address="198.51.100.99"'))
    proc = pyinfra(wrong, "deploys.preflight.preflight", check=False)
    assert proc.returncode == 1
    assert "host sandbox-b1: fabric_address 198.51.100.99 is not an address of this node" in proc.stderr
    assert "host sandbox-b0: fabric_address" not in proc.stderr


def _stream_in_flight(node: str, tokens: int):
    """A client's stream through ``node``'s endpoint (the sandbox's second client key), started in a thread and
    returned once its first piece arrived; ``thread.result`` gets its status and the completion tokens it counted."""
    import threading

    from deploys.endpoint import endpoint_url
    from deploys.inventory import inventory_configs, load_inventory
    from deploys.schema.control_readers import read_clients
    from deploys.service.unit import served_model_name

    cfg = inventory_configs(load_inventory(INVENTORY))[node]
    key = read_clients(cfg.endpoint_clients_file)["demo-stream"]
    body = {"model": served_model_name(cfg), "messages": [{"role": "user", "content": "Count."}], "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    started = threading.Event()

    def run():
        try:
            with requests.post(endpoint_url(cfg) + "/v1/chat/completions", json=body, stream=True, timeout=600,
                               headers={"Authorization": f"Bearer {key}"}, verify=cfg.endpoint_tls_ca) as r:
                thread.result["status"] = r.status_code
                for line in r.iter_lines(decode_unicode=True):
                    started.set()
                    if line.startswith("data: {") and '"completion_tokens"' in line:
                        usage = json.loads(line[5:]).get("usage") or {}
                        thread.result["tokens"] = usage.get("completion_tokens")
        finally:
            started.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.result = {}
    thread.start()
    assert started.wait(300), "the stream did not start"
    return thread


@pytest.mark.lifecycle
@pytest.mark.endpoint
def test_a_converge_killed_between_restart_and_gate_leaves_the_door_closed_and_the_next_gates_it(sandbox):
    """SIGKILL once the converge staged the new unit: an exit of the running release restarts that release. Then
    SIGKILL during the drain: the door stays shut, the node says so, the stream in flight finishes. Then
    SIGKILL while a head's new start waits for its gate: the release that runs has passed no gate, so the endpoint
    stays closed (no client gets its answers) and the node's metrics say it is not gated (ReleaseNotGated after its
    bound); the next converge finds the state as it is, gates the release that runs and opens the door."""
    node, flag = "sandbox-a", "/var/lib/inference-nodes-endpoint/grandpa.closed"
    record = "/var/lib/inference-nodes/grandpa.gate-passed.json"
    textfile = "/var/lib/inference-nodes/metrics/inference_nodes.prom"
    change = ["--limit", node, "--data", "service_restart_sec=31"]  # another unit: a restart
    # Issue 51, first: the new unit waits out of systemd's reach until the restart step. A converge killed once it
    # staged it, then a daemon-reload (apt's) and an exit of the running release: systemd restarts the running
    # release from its own files, never the new one ungated behind an open door.
    staged, live = "/var/lib/inference-nodes/staged/grandpa.container", "/etc/containers/systemd/grandpa.container"
    started, pid = "/run/inference-nodes/grandpa.started-from", "systemctl show -p MainPID --value grandpa.service"
    before, old_pid = on_node(node, f"cat {started}").stdout, on_node(node, pid).stdout.strip()
    proc = subprocess.Popen([PYINFRA, "-y", INVENTORY, "deploys/all.py", *change], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    waited = on_node(node, f"for i in $(seq 6000); do grep -qs '^RestartSec=31$' {staged} && exit 0; sleep 0.1; "
                           "done; exit 1")  # on the node: no round trip between the staging and the kill
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert waited.returncode == 0, "the converge staged no unit within 600 s"
    assert on_node(node, f"grep -q '^RestartSec=31$' {live}").returncode != 0, "the new unit went in place unswitched"
    assert on_node(node, "systemctl daemon-reload && systemctl kill -s KILL grandpa.service").returncode == 0
    deadline = time.monotonic() + 300
    while on_node(node, pid).stdout.strip() in ("", "0", old_pid) or on_node(node, f"test -s {started}").returncode:
        assert time.monotonic() < deadline, "systemd did not restart the killed release"
        time.sleep(2)
    assert on_node(node, f"cat {started}").stdout == before, "the restart started from other files than the release's"
    assert on_node(node, "systemctl show -p RestartUSec --value grandpa.service").stdout.strip() != "31s"
    # Issue 51 N2: then killed during its drain (a client's stream in flight holds it). The door is shut and the
    # running release serves on behind it; the node says so (endpoint_closed 1) and the switch marker, written
    # before the door, counts only the lease and the drain: EndpointClosed pages within minutes, not an hour later.
    # The stream in flight finishes on the running release.
    wait_serving([node])
    serving_pid = on_node(node, pid).stdout.strip()
    stream = _stream_in_flight(node, tokens=600)
    proc = subprocess.Popen([PYINFRA, "-y", INVENTORY, "deploys/all.py", *change], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    waited = on_node(node, f"for i in $(seq 6000); do test -e {flag} && exit 0; sleep 0.1; done; exit 1")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert waited.returncode == 0, "the converge closed no door within 600 s"
    assert stream.is_alive(), "the stream ended before the door closed: nothing held the drain"
    assert on_node(node, pid).stdout.strip() == serving_pid, "the killed drain restarted the service"
    marker = json.loads(on_node(node, "cat /var/lib/inference-nodes/grandpa.switching.json").stdout)
    assert 0 < marker["until"] - time.time() <= 300 + 120 + 5, marker  # the lease and endpoint_drain_s
    closed = f"grep -qx 'inference_nodes_endpoint_closed 1' {textfile}"
    deadline = time.monotonic() + 60
    while on_node(node, closed).returncode != 0:
        assert time.monotonic() < deadline, on_node(node, f"grep endpoint_closed {textfile}").stdout
        time.sleep(2)
    stream.join(timeout=300)
    assert stream.result.get("status") == 200 and stream.result.get("tokens") == 600, stream.result
    # then the switch itself, killed between its restart and its gate
    proc = subprocess.Popen([PYINFRA, "-y", INVENTORY, "deploys/all.py", *change], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 600
    restarted = f"grep -q '^RestartSec=31$' /etc/containers/systemd/grandpa.container && test ! -e {record}"
    while on_node(node, restarted).returncode != 0:  # decided from the node: its unit changed, its record gone
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before the restart"
        assert time.monotonic() < deadline, "no restart within 600 s"
        time.sleep(1)
    time.sleep(5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run ended before it could be killed between restart and gate"
    assert on_node(node, f"test -e {flag}").returncode == 0, "the door opened before any gate"
    # the killed converge's switch marker is a lease (service_switch_lease_s from its last renewal), not the whole
    # switch's bound: the alerts it mutes (InferenceServiceDown, EndpointClosed) speak within minutes
    marker = json.loads(on_node(node, "cat /var/lib/inference-nodes/grandpa.switching.json").stdout)
    assert marker["until"] - time.time() <= 300 + 5, marker  # the default lease (the old bound: 900 + 120 + 600 s)
    not_gated = (f"grep -qx 'inference_nodes_serving_release_gated 0' {textfile} && "
                 f"grep -qx 'inference_nodes_endpoint_closed 1' {textfile}")  # the door shut, for EndpointClosed
    deadline = time.monotonic() + 300  # once the service is active again, the metrics timer (5 s) says so
    while on_node(node, not_gated).returncode != 0:
        assert time.monotonic() < deadline, on_node(node, f"grep -e gated -e endpoint_closed {textfile}").stdout
        time.sleep(3)
    pyinfra(INVENTORY, "deploys/all.py", *change)  # the same converge again: it gates what runs
    assert on_node(node, f"test -e {flag}").returncode != 0, "the door stayed closed after the gate passed"
    assert on_node(node, f"grep -qx 'inference_nodes_endpoint_closed 0' {textfile} || "
                         f"{{ sleep 10; grep -qx 'inference_nodes_endpoint_closed 0' {textfile}; }}").returncode == 0
    assert on_node(node, f"grep -qx 'inference_nodes_serving_release_gated 1' {textfile} || "
                         f"{{ sleep 10; grep -qx 'inference_nodes_serving_release_gated 1' {textfile}; }}").returncode == 0
    pyinfra(INVENTORY, "deploys/all.py", "--limit", node)  # back to the inventory's unit (another switch)
    assert changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py", "--limit", node)) == []


def test_a_limited_run_from_a_control_node_without_the_other_clusters_files(sandbox, tmp_path):
    """A second admin's control node that lacks sandbox-a's endpoint files: a converge limited to the pair warns about
    sandbox-a's files and converges the pair (nothing to change); one that includes sandbox-a is refused, naming them,
    before any connection."""
    missing = inventory_copy(tmp_path, ('**_endpoint("127.0.0.2", 8441)',
                                        '**{**_endpoint("127.0.0.2", 8441), "endpoint_tls_cert": "/nonexistent/a.crt", '
                                        '"endpoint_clients_file": "/nonexistent/clients"}'))
    proc = pyinfra("--json", missing, "deploys/all.py", "--limit", "gb10-dspark")
    assert "sandbox-a: key 'endpoint_tls_cert'" in proc.stderr and "outside this run's limit" in proc.stderr
    assert changed_operations(proc) == []
    refused = pyinfra(missing, "deploys/all.py", "--limit", "sandbox-a", check=False)
    assert refused.returncode == 1 and "sandbox-a: key 'endpoint_clients_file'" in refused.stderr

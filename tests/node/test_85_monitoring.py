"""Monitoring on the sandbox (real node-exporter, Prometheus and Alertmanager from Debian; real vLLM): after the
converge, Prometheus on the monitoring host (sandbox-a) scrapes every node's exporter and every head's vLLM (sandbox-a's
through its authenticated endpoint, sandbox-b0's through its node-exporter), each toolkit metric holds the expected
value on every node, the vLLM metric names the rules read exist in the real vLLM, nothing listens beyond where the
inventory says, and stopping a head's service fires the service-down alert at the webhook, which resolves once it
serves again. (The deep-verify alert: test_60's silent flip; a node added to the inventory: test_70's drill.)"""

from __future__ import annotations

import time

import pytest
import requests

from deploys.monitoring import dashboard as mon_dashboard, host as mon_host, rules as mon_rules
from deploys.inventory import inventory_configs, load_inventory
from tests.node.conftest import INVENTORY, changed_operations, on_node, wait_serving

pytestmark = pytest.mark.monitoring  # the node tier's subject (`make test-fast SUBJECT=monitoring`)

WATCHER = "sandbox-a"


def _configs():
    return inventory_configs(load_inventory(INVENTORY))


def prometheus() -> str:
    return mon_host.prometheus_url(_configs()[WATCHER])  # on loopback: the nodes share this machine's network


def query(expr: str) -> list[dict]:
    r = requests.get(prometheus() + "/api/v1/query", params={"query": expr}, timeout=10)
    r.raise_for_status()
    return r.json()["data"]["result"]


def by_host(expr: str) -> dict[str, float]:
    return {s["metric"].get("host"): float(s["value"][1]) for s in query(expr)}


def eventually(what, check, timeout: float = 90, interval: float = 2):
    """``check()``'s answer once it is truthy; AssertionError with its last answer after ``timeout``."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except requests.RequestException as e:
            last = e
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})")


def test_prometheus_scrapes_every_node_and_head_and_reads_the_toolkits_metrics(sandbox):
    wait_serving(["sandbox-a", "sandbox-b0"])
    configs = _configs()
    nodes = {name for name, cfg in configs.items() if cfg.monitoring_enabled}
    assert nodes == set(sandbox)
    eventually("every exporter up", lambda: by_host('up{job="node"}') == {n: 1.0 for n in nodes})
    eventually("sandbox-a's vLLM up through its endpoint", lambda: by_host('up{job="vllm"}') == {"sandbox-a": 1.0})
    expected = {"inference_nodes_driver_module_matches": nodes, "inference_nodes_deep_verify_ok": nodes,
                "inference_nodes_gpu_query_ok": nodes, "inference_nodes_service_active": nodes,
                "inference_nodes_serving_gate_ok": {"sandbox-a", "sandbox-b0"}}
    for metric, hosts in expected.items():
        eventually(f"{metric} 1 on {sorted(hosts)}", lambda m=metric, h=hosts: by_host(m) == {n: 1.0 for n in h})
    for head in ("sandbox-a", "sandbox-b0"):
        info = query(f'inference_nodes_serving_gate_info{{host="{head}"}}')
        assert [s["metric"]["model_revision"] for s in info] == [configs[head].model_revision], info
    free = by_host("inference_nodes_model_free_bytes")
    assert set(free) == nodes and all(v > 0 for v in free.values()), free
    driver = query('inference_nodes_driver_info{host="sandbox-b1"}')
    assert driver and driver[0]["metric"]["module"] == driver[0]["metric"]["userspace"] != "", driver
    # the stand-in GPU reports [N/A] for utilization: absent, never 0
    assert query("inference_nodes_gpu_utilization_ratio") == []
    # every vLLM name the rules and the dashboard read, from the real vLLM of each head (a renamed metric would
    # make an alert that never fires)
    for name in mon_dashboard.VLLM_METRICS:
        eventually(f"{name} from both heads", lambda n=name: {s["metric"].get("host") for s in query(f'{{__name__="{n}"}}')}
                   >= {"sandbox-a", "sandbox-b0"})
    a = query('vllm:num_requests_running{host="sandbox-a"}')[0]["metric"]
    assert (a["image"], a["model_commit"]) == (configs["sandbox-a"].image_ref, configs["sandbox-a"].model_revision)
    # the watcher watched: Prometheus and Alertmanager scrape as targets of their own, each series a meta-alert reads
    # exists in the real ones, and the Watchdog fires (delivered nowhere here: no dead man's switch in the sandbox)
    eventually("Prometheus and Alertmanager scraped", lambda: {s["metric"]["job"]: float(s["value"][1]) for s in
                                                              query('up{job=~"prometheus|alertmanager"}')}
               == {"prometheus": 1.0, "alertmanager": 1.0})
    for name in mon_rules.SELF_METRICS:
        eventually(f"{name} from the monitoring host", lambda n=name: query(n))
    eventually("the Watchdog firing", lambda: query('ALERTS{alertname="Watchdog",alertstate="firing"}'))
    rules = requests.get(prometheus() + "/api/v1/rules", timeout=10).json()["data"]["groups"]
    assert {r["name"] for g in rules for r in g["rules"]} == set(mon_rules.ALERT_KEYS)
    state = "NodeExporterDown|InferenceServiceDown|ServingGateFailed|DeepVerifyBad|DriverModuleMismatch"
    firing = query(f'ALERTS{{alertstate="firing",alertname=~"{state}"}}')
    assert firing == [], "a converged, serving sandbox fires none of the alerts its state decides"


def test_monitoring_listens_on_loopback_and_the_exporter_address_only(sandbox):
    configs = _configs()
    me = configs[WATCHER]
    out = on_node(WATCHER, "ss -Hltnp").stdout
    mine = [line.split()[3] for line in out.splitlines() if "prometheus" in line or "alertmanager" in line]
    assert f"127.0.0.1:{me.prometheus_port}" in mine and f"127.0.0.1:{me.alertmanager_port}" in mine, mine
    assert all(a.startswith("127.0.0.1:") or a.startswith(configs[n].node_exporter_address + ":")
               for n in configs for a in mine if f":{configs[n].node_exporter_port}" in a), mine
    assert not [a for a in mine if a.endswith(":9094") or a.startswith(("*:", "0.0.0.0:", "[::]:"))], mine
    for name, cfg in configs.items():
        listen = on_node(name, f"ss -Hltnp 'sport = :{cfg.node_exporter_port}'").stdout
        addresses = sorted(line.split()[3] for line in listen.splitlines() if "users:" in line)
        assert addresses == sorted([f"127.0.0.1:{cfg.node_exporter_port}",
                                    f"{cfg.node_exporter_address}:{cfg.node_exporter_port}"]), (name, listen)



def test_a_failing_alerts_webhook_holds_the_watchdog_back_so_the_dead_mans_switch_pages(sandbox):
    """Issue 53: the alerts' webhook answers 500 (an expired token). AlertmanagerNotificationsFailing fires, and its
    own notification goes to that same webhook; so Alertmanager holds the Watchdog back while it fires (inhibited
    by it), and the outside dead man's switch, which hears nothing more, pages. A drill alert posted to
    Alertmanager, as Prometheus posts one, gives the webhook something to refuse."""
    from datetime import datetime, timedelta, timezone

    from tests.sandbox.webhook_listener import WebhookListener

    alertmanager = f"http://127.0.0.1:{_configs()[WATCHER].alertmanager_port}/api/v2"

    def watchdog() -> dict | None:
        alerts = requests.get(f"{alertmanager}/alerts", params={"filter": 'alertname="Watchdog"'}, timeout=10).json()
        return alerts[0] if alerts else None  # (none for a moment after Alertmanager restarted)

    def fingerprints(name: str) -> set[str]:
        return {a["fingerprint"] for a in
                requests.get(f"{alertmanager}/alerts", params={"filter": f'alertname="{name}"'}, timeout=10).json()}

    eventually("the Watchdog at Alertmanager", watchdog)
    with WebhookListener() as hook:
        hook.refused.add("/alerts")
        ends = (datetime.now(timezone.utc) + timedelta(minutes=3)).isoformat()
        drill = [{"labels": {"alertname": "SandboxDrill", "host": WATCHER, "severity": "warning"},
                  "annotations": {"summary": "a drill alert for the refusing webhook"}, "endsAt": ends}]
        assert requests.post(f"{alertmanager}/alerts", json=drill, timeout=10).status_code == 200
        eventually("AlertmanagerNotificationsFailing firing",
                   lambda: query('ALERTS{alertname="AlertmanagerNotificationsFailing",alertstate="firing"}'),
                   timeout=120)
        held = eventually("the Watchdog held back by it", lambda: (w := watchdog()) and w["status"]["state"] == "suppressed"
                          and set(w["status"]["inhibitedBy"]) & fingerprints("AlertmanagerNotificationsFailing")
                          and w, timeout=60)
        assert held["status"]["silencedBy"] == [], held
        assert hook.received("SandboxDrill", "/alerts") == [], "the refusing webhook took nothing"


def test_a_monitoring_host_of_its_own_serves_no_model_and_watches_the_lab(sandbox, tmp_path):
    """Issue 53: the monitoring host need not be an inference node. A fourth sandbox node, in the group `monitoring`
    and no cluster, converged alone: the run is validate, the package manager and the monitoring host's step (no
    driver, runtime, model or service), a second run changes nothing, its Prometheus scrapes every node's exporter and
    sandbox-a's vLLM through its endpoint, its Alertmanager delivers the Watchdog to its own dead man's switch, and the
    audit of it passes. The nodes' own monitoring host (sandbox-a) is left as it was."""
    import json
    import os
    import subprocess
    import sys

    from tests.node.conftest import NODE_SH, inventory_copy, pyinfra
    from tests.sandbox.webhook_listener import WebhookListener

    url = tmp_path / "watchdog-m-url"
    url.write_text("http://127.0.0.1:9199/watchdog-m\n")
    os.chmod(url, 0o600)
    inventory = inventory_copy(tmp_path)
    with open(inventory, "a") as f:
        f.write(f"""
monitoring = [("sandbox-m", {{"ssh_hostname": "127.0.0.1", "ssh_port": 2205, "ssh_user": "root",
                             "ssh_key": f"{{_DIR}}/ssh/id_ed25519", "ssh_strict_host_key_checking": "off",
                             "ssh_known_hosts_file": "/dev/null", "_sudo": False,
                             **_monitoring_host(), "prometheus_port": 9290, "alertmanager_port": 9293,
                             "alertmanager_watchdog_url_file": "{url}"}})]
""")
    try:
        up = subprocess.run([NODE_SH, "up", "sandbox-m", "2205", "0"], capture_output=True, text=True)
        assert up.returncode == 0, up.stderr[-3000:]
        # a bare host: the sandbox's rootfs carries Podman for the inference nodes (tests/sandbox/node.sh PKGS)
        purge = on_node("sandbox-m", "DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq podman >/dev/null 2>&1; "
                                     "command -v podman")
        assert purge.returncode != 0, purge.stdout
        with WebhookListener() as hook:
            since = time.time()
            first = json.loads(pyinfra("--json", inventory, "deploys/all.py", "--limit", "sandbox-m").stdout)
            steps = {op["name"].split(" | ")[0] for op in first["results"]["operations"]}
            assert steps == {"Package manager", "Monitoring host"}, steps
            second = pyinfra("--json", inventory, "deploys/all.py", "--limit", "sandbox-m")
            assert changed_operations(second) == []
            for program in ("podman", "nvidia-smi"):
                assert on_node("sandbox-m", f"command -v {program}").returncode != 0, f"{program} on the monitoring host"
            base = "http://127.0.0.1:9290"

            def targets_up() -> set[tuple[str, str]]:
                targets = requests.get(base + "/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
                return {(t["labels"].get("host"), t["labels"]["job"]) for t in targets if t["health"] == "up"}
            want = {("sandbox-a", "node"), ("sandbox-b0", "node"), ("sandbox-b1", "node"), ("sandbox-a", "vllm"),
                    ("sandbox-m", "prometheus"), ("sandbox-m", "alertmanager")}
            eventually("every target of the lab up on sandbox-m's Prometheus", lambda: want <= targets_up(), timeout=120)
            eventually("the Watchdog at sandbox-m's dead man's switch",
                       lambda: hook.received("Watchdog", "/watchdog-m", since), timeout=120)
        audit = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/audit/test_monitoring.py", "--inventory",
                                inventory, "--limit", "sandbox-m"],
                               capture_output=True, text=True, timeout=300)
        assert audit.returncode == 0 and audit.stdout.strip().splitlines()[-1].startswith("3 passed"), audit.stdout[-3000:]
    finally:
        subprocess.run([NODE_SH, "down", "sandbox-m"], capture_output=True)


def test_a_reload_that_failed_or_a_hand_edit_loaded_is_repaired_by_the_next_converge(sandbox):
    """Issue 53: rules made unparsable and loaded by a HUP (Prometheus keeps the old ones and says its reload failed),
    then the file put right: the converge reloads because Prometheus says so, not only when its files changed, and
    the reload step waits for Prometheus's own word that it loaded them. In the same converge, Alertmanager's
    configuration edited by hand and loaded (its Watchdog inhibition gone): the converge writes it back and
    applies it, although the content it writes is the one it applied before."""
    from tests.node.conftest import changed_operations, pyinfra

    reload_step = "Monitoring host | Reload Prometheus after a change of targets or rules (promtool checks them first)"
    am_steps = ["Monitoring host | Install Alertmanager's configuration (0600: the webhook URL may carry a token)",
                "Monitoring host | Apply Alertmanager's unit and configuration (daemon-reload, restart)"]
    status = f"http://127.0.0.1:{_configs()[WATCHER].alertmanager_port}/api/v2/status"

    def am_inhibits() -> bool:  # what the running Alertmanager loaded (never printed: it holds the webhook URLs)
        return "inhibit_rules" in requests.get(status, timeout=10).json()["config"]["original"]

    assert am_inhibits()
    # (Alertmanager reads systemd's credential copy of the file: only a restart loads an edit)
    edit = (f"sed -i '/^inhibit_rules:/,$d' {mon_host.ALERTMANAGER_CONF} && "
            f"systemctl restart {mon_host.ALERTMANAGER}.service")
    assert on_node(WATCHER, edit).returncode == 0
    eventually("Alertmanager loaded the hand edit", lambda: not am_inhibits(), timeout=30)
    loaded = "python3 /usr/local/lib/inference-nodes/prometheus_loaded.py 9190"
    good = on_node(WATCHER, f"cat {mon_host.RULES}").stdout
    assert good and on_node(WATCHER, loaded).stdout.strip() == "loaded"
    bad = (f"cp {mon_host.RULES} /root/rules.good && echo 'groups: [{{name: x, rules: [{{alert: X, expr: \"(\"}}]}}]' "
           f"> {mon_host.RULES} && systemctl kill -s HUP {mon_host.PROMETHEUS}.service")
    assert on_node(WATCHER, bad).returncode == 0
    for _ in range(20):
        if on_node(WATCHER, loaded).stdout.strip() == "not-loaded":
            break
        time.sleep(0.5)
    assert on_node(WATCHER, loaded).stdout.strip() == "not-loaded", "Prometheus took the unparsable rules"
    # the file right again (as a converge that ran before would leave it): only Prometheus's word says to reload
    assert on_node(WATCHER, f"mv /root/rules.good {mon_host.RULES}").returncode == 0
    changed = changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py", "--limit", WATCHER))
    assert changed == [(am_steps[0], [WATCHER]), (am_steps[1], [WATCHER]), (reload_step, [WATCHER])], changed
    assert on_node(WATCHER, loaded).stdout.strip() == "loaded"
    eventually("Alertmanager runs the inventory's configuration again", am_inhibits, timeout=30)
    assert changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py", "--limit", WATCHER)) == []

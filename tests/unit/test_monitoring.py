"""Monitoring (deploys/monitoring/): the alert rules behave as documented under `promtool test rules` (each alert
fires on its condition after its `for:` window and stays quiet on a healthy node), the generated Prometheus
configuration passes `promtool check config`, the dashboard and rules ask only for metrics that exist, and
validation names what cannot be scraped before any connection."""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap

import pytest
import yaml

from deploys.monitoring import dashboard as mon_dashboard, host as mon_host, host_files as mon_files, node as mon_node, rules as mon_rules
from deploys.inventory import load_inventory
from deploys.schema import InventoryValidationError, NodeConfig, validate_inventory
from deploys.schema.control_readers import read_webhook_url
from tests.unit.test_node_facts import nf
from tests.unit.test_schema import node_a

SANDBOX_DIR = os.environ.get("SANDBOX_DIR", "/var/tmp/inference-nodes-sandbox")
PROMTOOL = os.environ.get("PROMTOOL", f"{SANDBOX_DIR}/tools/promtool")  # tests/sandbox/node.sh promtool


@pytest.fixture(scope="module")
def promtool() -> str:
    if not os.access(PROMTOOL, os.X_OK):
        pytest.fail(f"no promtool at {PROMTOOL}: run `tests/sandbox/node.sh promtool` (make test and make unit do)")
    return PROMTOOL


def _me(**keys) -> NodeConfig:
    data = node_a(**{"alert_for_s": 60, "alert_not_generating_for_s": 120, "alert_requests_waiting_for_s": 120,
                     "alert_kv_cache_usage_max": 0.9, "alert_restarts_max": 3, "alert_model_disk_free_min_gib": 10,
                     "alert_not_gated_for_s": 120,
                     **keys})
    from deploys.schema import validate_hosts
    return validate_hosts(data)["node-a"]


def _summary(name: str, me: NodeConfig, labels: dict, value: str = "") -> str:
    rule = next(r for r in mon_rules.alert_rules(me) if r["alert"] == name)
    text = rule["annotations"]["summary"]
    for key in ("host", "job", "commit"):
        text = text.replace(f"{{{{ $labels.{key} }}}}", labels.get(key, ""))
    return text.replace("{{ $value }}", value)


N = {"host": "n1", "cluster": "c1"}
L = 'host="n1",cluster="c1"'
COMMIT = "9e165c30e2704aec5d9d593cce3eebd58bbef1cb"  # the deep verify's record names the commit it checked
HEALTHY = [  # a serving head: every series the rules read, at good values (one sample a minute)
    (f'up{{job="node",{L}}}', "1x20"),
    (f'up{{job="vllm",{L}}}', "1x20"),
    (f'inference_nodes_service_active{{job="node",{L}}}', "1x20"),
    (f'inference_nodes_switch_in_progress{{job="node",{L}}}', "0x20"),
    (f'inference_nodes_service_restarts_total{{job="node",{L}}}', "0x20"),
    (f'inference_nodes_service_unplanned_restarts_total{{job="node",{L}}}', "0x20"),
    (f'vllm:num_requests_running{{job="vllm",{L}}}', "1x20"),
    (f'vllm:num_requests_waiting{{job="vllm",{L}}}', "0x20"),
    (f'vllm:generation_tokens_total{{job="vllm",{L}}}', "0+600x20"),
    (f'vllm:kv_cache_usage_perc{{job="vllm",{L}}}', "0.3x20"),
    (f'inference_nodes_serving_gate_ok{{job="node",{L}}}', "1x20"),
    (f'inference_nodes_serving_release_gated{{job="node",{L}}}', "1x20"),
    (f'inference_nodes_endpoint_closed{{job="node",{L}}}', "0x20"),
    (f'inference_nodes_gpu_query_ok{{job="node",{L}}}', "1x20"),
    (f'inference_nodes_gpu_xid_errors{{job="node",kind="hardware",{L}}}', "0x20"),
    (f'inference_nodes_gpu_xid_errors{{job="node",kind="other",{L}}}', "0x20"),
    (f'inference_nodes_gpu_ecc_uncorrected_errors{{job="node",{L}}}', "0x20"),
    # the monitoring host watching itself
    (f'up{{job="prometheus",{L}}}', "1x20"),
    (f'up{{job="alertmanager",{L}}}', "1x20"),
    (f'prometheus_config_last_reload_successful{{job="prometheus",{L}}}', "1x20"),
    (f'prometheus_rule_evaluation_failures_total{{job="prometheus",{L}}}', "0x20"),
    (f'alertmanager_notifications_failed_total{{job="alertmanager",{L}}}', "0x20"),
    (f'alertmanager_config_last_reload_successful{{job="alertmanager",{L}}}', "1x20"),
    (f'inference_nodes_deep_verify_ok{{job="node",commit="{COMMIT}",{L}}}', "1x20"),
    (f'inference_nodes_deep_verify_timestamp_seconds{{job="node",{L}}}', "0x20"),
    (f'inference_nodes_deep_verify_max_age_seconds{{job="node",{L}}}', "100000x20"),
    (f'inference_nodes_driver_module_matches{{job="node",{L}}}', "1x20"),
    (f'inference_nodes_model_free_bytes{{job="node",{L}}}', f"{500 * 2**30}x20"),
    (f'inference_nodes_vllm_metrics_ok{{job="node",{L}}}', "1x20"),
    (f'inference_nodes_facts_timestamp_seconds{{job="node",{L}}}', "0+60x20"),
    (f'inference_nodes_facts_interval_seconds{{job="node",{L}}}', "60x20"),
]

# alert -> (the series that break it, minutes after which it fires, minutes at which it does not yet, extra labels)
BROKEN = {
    "NodeExporterDown": ({f'up{{job="node",{L}}}': "1 1 0x18"}, 4, 2, {"job": "node"}),
    "InferenceServiceDown": ({f'up{{job="vllm",{L}}}': "1 1 0x18"}, 4, 2, {}),
    "InferenceServiceRestarting": ({f'inference_nodes_service_unplanned_restarts_total{{job="node",{L}}}': "0 0 1 2 3x16"}, 5, 3,
                                   {"job": "node"}),
    "InferenceNotGenerating": ({f'vllm:generation_tokens_total{{job="vllm",{L}}}': "0+600x5 3000x15"}, 10, 6, {}),
    "KvCacheHigh": ({f'vllm:kv_cache_usage_perc{{job="vllm",{L}}}': "0.3 0.3 0.97x18"}, 4, 2, {"job": "vllm"}),
    "RequestsWaitingLong": ({f'vllm:num_requests_waiting{{job="vllm",{L}}}': "0 0 4x18"}, 5, 3, {"job": "vllm"}),
    "EndpointClosed": ({f'inference_nodes_endpoint_closed{{job="node",{L}}}': "0 0 1x18"}, 4, 2, {"job": "node"}),
    "ServingGateFailed": ({f'inference_nodes_serving_gate_ok{{job="node",{L}}}': "1 1 0x18"}, 2, 1, {"job": "node"}),
    "ReleaseNotGated": ({f'inference_nodes_serving_release_gated{{job="node",{L}}}': "1 1 0x18"}, 5, 3, {"job": "node"}),
    "DeepVerifyBad": ({f'inference_nodes_deep_verify_ok{{job="node",commit="{COMMIT}",{L}}}': "1 1 0x18"}, 2, 1,
                      {"job": "node", "commit": COMMIT}),  # the summary names the commit the deep verify checked
    "DeepVerifyOverdue": ({f'inference_nodes_deep_verify_max_age_seconds{{job="node",{L}}}': "100000 100000 60x18"}, 2, 1,
                          {"job": "node"}),
    "DriverModuleMismatch": ({f'inference_nodes_driver_module_matches{{job="node",{L}}}': "1 1 0x18"}, 4, 2, {"job": "node"}),
    "NodeFactsStale": ({f'inference_nodes_facts_timestamp_seconds{{job="node",{L}}}': "0+60x5 300x15"}, 11, 9,
                       {"job": "node"}),
    "GpuNotAnswering": ({f'inference_nodes_gpu_query_ok{{job="node",{L}}}': "1 1 0x18"}, 4, 2, {"job": "node"}),
    "GpuXidHardware": ({f'inference_nodes_gpu_xid_errors{{job="node",kind="hardware",{L}}}': "0 0 1x18"}, 2, 1,
                       {"job": "node", "kind": "hardware"}),
    "GpuXidErrors": ({f'inference_nodes_gpu_xid_errors{{job="node",kind="other",{L}}}': "0 0 3x18"}, 2, 1,
                     {"job": "node", "kind": "other"}),
    "GpuEccUncorrected": ({f'inference_nodes_gpu_ecc_uncorrected_errors{{job="node",{L}}}': "0 0 2x18"}, 2, 1,
                          {"job": "node"}),
    "NodeFactsMissing": ({f'inference_nodes_facts_timestamp_seconds{{job="node",{L}}}': "0+60x5 _x15"}, 12, 8,
                         {"job": "node"}),
    "PrometheusConfigReloadFailed": ({f'prometheus_config_last_reload_successful{{job="prometheus",{L}}}': "1 1 0x18"},
                                     2, 1, {"job": "prometheus"}),
    "PrometheusRuleEvaluationFailures": ({f'prometheus_rule_evaluation_failures_total{{job="prometheus",{L}}}':
                                          "0 0 1x18"}, 2, 1, {"job": "prometheus"}),
    "AlertmanagerNotificationsFailing": ({f'alertmanager_notifications_failed_total{{job="alertmanager",{L}}}':
                                          "0 0 2x18"}, 2, 1, {"job": "alertmanager"}),
    "AlertmanagerConfigReloadFailed": ({f'alertmanager_config_last_reload_successful{{job="alertmanager",{L}}}':
                                        "1 1 0x18"}, 2, 1, {"job": "alertmanager"}),
    "MonitoringSelfScrapeDown": ({f'up{{job="alertmanager",{L}}}': "1 1 0x18"}, 4, 2, {"job": "alertmanager"}),
    "ModelDiskNearlyFull": ({f'inference_nodes_model_free_bytes{{job="node",{L}}}': f"{500 * 2**30} {500 * 2**30} {2**30}x18"},
                            4, 2, {"job": "node"}),
}


def _run_promtool_test(promtool, tmp_path, me: NodeConfig, series: list[tuple[str, str]], checks: list[dict]):
    (tmp_path / "alerts.yml").write_text(mon_rules.render_rules(me))
    test = {"rule_files": ["alerts.yml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series],
                       "alert_rule_test": checks}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    return subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True)


def test_every_alert_is_tested():
    assert {r["alert"] for r in mon_rules.alert_rules(_me())} == {*BROKEN, "Watchdog"} == set(mon_rules.ALERT_KEYS)


def test_rules_pass_promtool_check(promtool, tmp_path):
    (tmp_path / "alerts.yml").write_text(mon_rules.render_rules(_me()))
    out = subprocess.run([promtool, "check", "rules", "alerts.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(BROKEN) + 1} rules found" in out.stdout


def test_a_healthy_head_fires_no_alert_but_the_watchdog(promtool, tmp_path):
    me = _me()
    checks = [{"eval_time": f"{m}m", "alertname": name, "exp_alerts": []} for name in BROKEN for m in (5, 15)]
    checks += [{"eval_time": f"{m}m", "alertname": "Watchdog", "exp_alerts": [
        {"exp_labels": {"severity": "none"}, "exp_annotations": {"summary": _summary("Watchdog", me, {})}}]}
        for m in (0, 5, 15)]
    out = _run_promtool_test(promtool, tmp_path, me, HEALTHY, checks)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_gpu_that_does_not_answer_is_not_called_a_driver_mismatch(promtool, tmp_path):
    """nvidia-smi failing makes the driver's match unknown (0): GpuNotAnswering fires, DriverModuleMismatch does
    not (its 'reboot it' is the wrong advice for a GPU off the bus)."""
    me = _me()
    down = {f'inference_nodes_gpu_query_ok{{job="node",{L}}}': "1 1 0x18",
            f'inference_nodes_driver_module_matches{{job="node",{L}}}': "1 1 0x18"}
    series = [(s, down.get(s, v)) for s, v in HEALTHY]
    labels = {**N, "job": "node", "severity": "critical"}
    checks = [{"eval_time": "6m", "alertname": "DriverModuleMismatch", "exp_alerts": []},
              {"eval_time": "6m", "alertname": "GpuNotAnswering", "exp_alerts": [
                  {"exp_labels": labels, "exp_annotations": {"summary": _summary("GpuNotAnswering", me, labels)}}]}]
    out = _run_promtool_test(promtool, tmp_path, me, series, checks)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_watchdog_goes_to_its_own_receiver_and_nothing_else_does(tmp_path):
    me = _me()
    conf = yaml.safe_load(mon_files.render_alertmanager(me, "https://hooks.example/a", "https://dms.example/ping"))
    [watchdog] = conf["route"]["routes"]
    assert watchdog["matchers"] == ['alertname="Watchdog"'] and watchdog["receiver"] == "watchdog"
    assert watchdog["repeat_interval"] == mon_rules.WATCHDOG_REPEAT
    receivers = {r["name"]: r for r in conf["receivers"]}
    assert receivers["watchdog"]["webhook_configs"][0]["url"] == "https://dms.example/ping"
    assert receivers["webhook"]["webhook_configs"][0]["url"] == "https://hooks.example/a"
    nowhere = yaml.safe_load(mon_files.render_alertmanager(me, "https://hooks.example/a"))
    assert nowhere["route"]["routes"][0]["receiver"] == "none", "no dead man's switch: not to the alerts' webhook"
    # while the alerting path fails (its own alerts may not reach anyone), the Watchdog is held back: the switch
    # hears nothing and pages. Each name is a real alert; the Watchdog never holds itself back
    [inhibit] = conf["inhibit_rules"]
    assert inhibit["target_matchers"] == ['alertname="Watchdog"'], inhibit
    [source] = inhibit["source_matchers"]
    held_by = set(source.removeprefix('alertname=~"').removesuffix('"').split("|"))
    assert held_by == {"AlertmanagerNotificationsFailing", "AlertmanagerConfigReloadFailed",
                       "PrometheusConfigReloadFailed", "PrometheusRuleEvaluationFailures", "MonitoringSelfScrapeDown"}
    assert held_by < {r["alert"] for r in mon_rules.alert_rules(me)} and "Watchdog" not in held_by


def test_a_head_whose_vllm_stops_answering_on_loopback_is_down(promtool, tmp_path):
    """A head scraped through its node-exporter (no endpoint): vLLM not answering the facts program fires
    InferenceServiceDown although the unit is active."""
    me = _me()
    series = [(s, "1 1 0x18" if "vllm_metrics_ok" in s else v) for s, v in HEALTHY if 'job="vllm"' not in s]
    series += [(f'vllm:generation_tokens_total{{job="node",{L}}}', "0+600x20")]
    labels = {**N, "severity": "critical"}
    checks = [{"eval_time": "4m", "alertname": "InferenceServiceDown",
               "exp_alerts": [{"exp_labels": labels, "exp_annotations": {"summary": _summary("InferenceServiceDown", me, labels)}}]}]
    out = _run_promtool_test(promtool, tmp_path, me, series, checks)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("name", list(BROKEN))
def test_each_alert_fires_on_its_condition_after_its_window(promtool, tmp_path, name):
    me = _me()
    broken, fires, not_yet, extra = BROKEN[name]
    series = [(s, broken.get(s, v)) for s, v in HEALTHY]
    labels = {**N, **extra, "severity": next(r for r in mon_rules.alert_rules(me) if r["alert"] == name)["labels"]["severity"]}
    value = "3" if name == "InferenceServiceRestarting" else ""
    checks = [{"eval_time": f"{not_yet}m", "alertname": name, "exp_alerts": []},
              {"eval_time": f"{fires}m", "alertname": name,
               "exp_alerts": [{"exp_labels": labels, "exp_annotations": {"summary": _summary(name, me, labels, value)}}]}]
    out = _run_promtool_test(promtool, tmp_path, me, series, checks)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_generated_prometheus_configuration_passes_promtool(promtool, tmp_path):
    """The sandbox's own inventory (an endpoint head, a plain pair), its config checked with the credential and CA
    files it names put in place, as the unit's ExecStartPre checks it on the node."""
    inv = load_inventory("inventories/sandbox.py")
    configs = validate_inventory(inv)
    watcher = mon_node.monitoring_host_name(inv)
    assert watcher == "sandbox-a"
    text = mon_files.render_prometheus(configs, configs[watcher], watcher)
    conf = yaml.safe_load(text)
    jobs = {j["job_name"]: j for j in conf["scrape_configs"]}
    assert [t["labels"]["host"] for t in jobs["node"]["static_configs"]] == ["sandbox-a", "sandbox-b0", "sandbox-b1"]
    assert set(jobs) == {"node", "vllm-sandbox-a", "prometheus", "alertmanager"}, \
        "b0's vLLM comes through its node-exporter (no endpoint); the monitoring host scrapes itself"
    assert jobs["alertmanager"]["static_configs"] == [{"targets": ["127.0.0.1:9193"], "labels": {"host": "sandbox-a"}}]
    for path in re.findall(r"(?:credentials_file|ca_file): (\S+)", text):
        (tmp_path / os.path.basename(path)).write_text("x\n")
        text = text.replace(path, str(tmp_path / os.path.basename(path)))
    (tmp_path / "alerts.yml").write_text(mon_rules.render_rules(configs[watcher]))
    (tmp_path / "prometheus.yml").write_text(text.replace(mon_host.RULES, str(tmp_path / "alerts.yml")))
    out = subprocess.run([promtool, "check", "config", "prometheus.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    facts = mon_node.render_facts_config("sandbox-b0", configs["sandbox-b0"], watcher)
    assert '"vllm_metrics_url": "http://127.0.0.1:18102/metrics"' in facts  # vLLM itself, not its door on 8102
    assert '"vllm_metrics_url": null' in mon_node.render_facts_config("sandbox-a", configs["sandbox-a"], watcher)


def _exported_names() -> set[str]:
    """The names node_facts.py exports (its families, with their prefix, and the loopback vLLM read's verdict)."""
    return {nf.PREFIX + name for name in nf.FAMILIES} | {nf.VLLM_OK}


NODE_EXPORTER_NAMES = {"up", "node_memory_MemAvailable_bytes"}


def _queried(expr: str) -> set[str]:
    names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*(?=\s*(?:\{|\[|\)|$| [<>=!]| or| unless| and|\s*\+))", expr))
    return names - {"sum", "by", "rate", "increase", "max", "time", "histogram_quantile", "le", "host", "cluster", "or",
                    "unless", "and"}


def test_rules_and_dashboard_ask_only_for_metrics_that_exist():
    """A renamed metric makes a rule that never fires (vLLM's gpu_cache_usage_perc): every name a rule or a panel
    reads is one node_facts.py exports, one vLLM exports (VLLM_METRICS, checked against the real vLLM in the node
    tier) or node-exporter's own."""
    known = _exported_names() | set(mon_dashboard.VLLM_METRICS) | NODE_EXPORTER_NAMES | set(mon_rules.SELF_METRICS)
    exprs = [r["expr"] for r in mon_rules.alert_rules(_me())]
    exprs += [p["targets"][0]["expr"] for p in __import__("json").loads(mon_dashboard.render_dashboard())["panels"]]
    unknown = {name for e in exprs for name in _queried(e)} - known
    assert not unknown, unknown
    used = {name for e in exprs for name in _queried(e)}
    assert {"vllm:kv_cache_usage_perc", "inference_nodes_deep_verify_ok", "up"} <= used


def _inventory(tmp_path, body: str):
    path = tmp_path / f"inv{len(list(tmp_path.glob('inv*.py')))}.py"
    path.write_text(textwrap.dedent(body))
    return load_inventory(str(path))


def test_validation_names_a_monitoring_setup_that_cannot_scrape(tmp_path):
    a = node_a()["node-a"]
    two = _inventory(tmp_path, f"""
        one = [("n1", {a!r}), ("n2", {{**{a!r}, "cluster_name": "other", "ssh_hostname": "192.0.2.30", "endpoint_enabled": False, "monitoring_enabled": True}})]
        monitoring = ["n1", "n2"]
    """)
    with pytest.raises(InventoryValidationError) as err:
        validate_inventory(two)
    text = str(err.value)
    assert "one host in group monitoring" in text and "n1" in text and "n2" in text
    loopback = _inventory(tmp_path, f"""
        one = [("n1", {a!r}), ("n2", {{**{a!r}, "cluster_name": "other", "ssh_hostname": "192.0.2.30", "endpoint_enabled": False, "monitoring_enabled": True}})]
        monitoring = ["n1"]
    """)
    with pytest.raises(InventoryValidationError) as err:
        validate_inventory(loopback)
    assert "host n2: key 'node_exporter_address' = None: expected an address of n2 that the monitoring host n1" in str(err.value)
    own = _inventory(tmp_path, f"""
        one = [("n1", {a!r}), ("n2", {{**{a!r}, "cluster_name": "other", "ssh_hostname": "192.0.2.30", "endpoint_enabled": False, "monitoring_enabled": True,
                                       "node_exporter_address": "127.0.0.1"}})]
        monitoring = ["n1"]
    """)
    with pytest.raises(InventoryValidationError) as err:
        validate_inventory(own)
    assert "not loopback: Prometheus would scrape its own host's exporter" in str(err.value)
    fine = _inventory(tmp_path, f"""
        one = [("n1", {a!r}), ("n2", {{**{a!r}, "cluster_name": "other", "ssh_hostname": "192.0.2.30", "endpoint_enabled": False, "monitoring_enabled": True,
                                       "node_exporter_address": "192.0.2.30"}})]
        monitoring = ["n1"]
    """)
    assert set(validate_inventory(fine)) == {"n1", "n2"}


def test_a_monitoring_host_without_a_dead_mans_switch_is_warned_about(tmp_path, capsys):
    """Valid, but nothing pages when the monitoring host or its alerting path fails: said before the run (the
    CLI's check and `python -m deploys.validate`), naming the host and the key."""
    from deploys import validate as validate_cli
    from deploys.schema.cross_host import monitoring_warnings

    a = node_a()["node-a"]
    body = """
        one = [("n1", {a!r}), ("n2", {{**{a!r}, "cluster_name": "other", "ssh_hostname": "192.0.2.30", "endpoint_enabled": False, "monitoring_enabled": True,
                                       "node_exporter_address": "192.0.2.30"{extra}}})]
        monitoring = ["n2"]
    """
    unwatched = _inventory(tmp_path, body.format(a=a, extra=""))
    [warning] = monitoring_warnings(unwatched, validate_inventory(unwatched))
    assert warning.startswith("host n2: alertmanager_watchdog_url_file is unset: ") and "nothing pages" in warning
    assert validate_cli.main([str(sorted(tmp_path.glob("inv*.py"))[-1])]) == 0
    assert f"warning: {warning}" in capsys.readouterr().err
    url = tmp_path / "dms-url"
    url.write_text("https://dms.example/ping/abc\n")
    url.chmod(0o600)
    watched = _inventory(tmp_path, body.format(a=a, extra=f', "alertmanager_watchdog_url_file": "{url}"'))
    assert monitoring_warnings(watched, validate_inventory(watched)) == []


def _with_watcher(tmp_path, watcher: dict, everyone: dict | None = None):
    """Node A's cluster (its exporter on a LAN address) and a host of its own in the group `monitoring`, its entry
    ``watcher``; ``everyone``: keys group_data/all.py sets for every host."""
    a = {**node_a()["node-a"], "monitoring_enabled": True, "node_exporter_address": "192.0.2.10"}
    (tmp_path / "group_data").mkdir(exist_ok=True)
    (tmp_path / "group_data" / "all.py").write_text("".join(f"{k} = {v!r}\n" for k, v in (everyone or {}).items()))
    path = tmp_path / f"inv{len(list(tmp_path.glob('inv*.py')))}.py"
    path.write_text(f"""one = [("n1", {a!r})]\nmonitoring = [("mon", {{"ssh_hostname": "192.0.2.99", **{watcher!r}}})]\n""")
    return load_inventory(str(path))


def test_a_monitoring_host_in_no_cluster_is_no_inference_node(tmp_path):
    """A host of the group `monitoring` without a cluster_name validates with the monitoring host's and the package
    manager's keys alone (none of an inference node's are required); keys the layers every host shares set for the
    inference nodes are not its; an inference key on its own entry is refused, naming it."""
    from deploys.schema.cross_host import monitoring_only_validated, monitoring_warnings

    inventory = _with_watcher(tmp_path, {"prometheus_port": 9290, "apt_lock_timeout_s": 60},
                              everyone={"model_size_gb": 3, "alert_for_s": 20})
    assert set(validate_inventory(inventory)) == {"n1"}  # the inference nodes
    only, problems = monitoring_only_validated(inventory)
    assert problems == [] and set(only) == {"mon"}
    mon = only["mon"]
    assert (mon.prometheus_port, mon.apt_lock_timeout_s, mon.alert_for_s) == (9290, 60, 20)  # a layer's key of its own
    assert not hasattr(mon, "model_size_gb") and not hasattr(mon, "image")
    assert "host mon: alertmanager_watchdog_url_file is unset" in monitoring_warnings(inventory, validate_inventory(inventory))[0]
    conf = yaml.safe_load(mon_files.render_prometheus(validate_inventory(inventory), mon, "mon"))
    assert conf["scrape_configs"][0]["static_configs"][0]["targets"] == ["192.0.2.10:9100"]  # n1's LAN exporter
    assert [j["job_name"] for j in conf["scrape_configs"]] == ["node", "vllm-n1", "prometheus", "alertmanager"]

    wrong = _with_watcher(tmp_path, {"image": "registry.example/x:1", "service_restart_sec": 5})
    with pytest.raises(InventoryValidationError) as err:
        validate_inventory(wrong)
    text = str(err.value)
    assert "host mon: key 'image' = 'registry.example/x:1': expected no key of a monitoring-only host" in text
    assert "host mon: key 'service_restart_sec'" in text and "host n1" not in text
    typo = _with_watcher(tmp_path, {"prometheus_prot": 9290})
    with pytest.raises(InventoryValidationError, match="host mon: key 'prometheus_prot'"):
        validate_inventory(typo)
    same = _with_watcher(tmp_path, {"prometheus_port": 9293, "alertmanager_port": 9293})
    with pytest.raises(InventoryValidationError, match="host mon: key 'alertmanager_port' = 9293: expected a port apart"):
        validate_inventory(same)


def test_a_monitoring_only_host_renders_its_monitoring_files_alone(tmp_path):
    from deploys import apt_state
    from deploys.render import render_inventory

    _with_watcher(tmp_path, {"prometheus_port": 9290})
    out = tmp_path / "out"
    written = render_inventory(str(sorted(tmp_path.glob("inv*.py"))[-1]), str(out), ["mon"])
    have = sorted(os.path.relpath(p, out / "mon") for p in written)
    assert have == sorted(p.lstrip("/") for p in (apt_state.LOCK_DROPIN, *mon_host.HOST_FILES,
                                                  mon_files.scrape_key_path("n1"))), have


@pytest.mark.parametrize("keys,key", [
    ({"node_exporter_address": "0.0.0.0"}, "node_exporter_address"),
    ({"node_exporter_address": "lan"}, "node_exporter_address"),
    ({"node_exporter_port": 8000}, "node_exporter_port"),  # vLLM's API port on loopback
    ({"node_exporter_port": 22}, "node_exporter_port"),  # sshd's
])
def test_exporter_keys_refuse_a_wildcard_or_a_clash(keys, key):
    from deploys.schema import validate_hosts
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(node_a(monitoring_enabled=True, **keys))
    assert key in {p.key for p in err.value.problems}


def test_the_webhook_url_is_a_private_file_and_never_shown(tmp_path):
    from deploys.schema import validate_hosts
    secret = "https://hooks.example/T0KEN-never-shown"
    url = tmp_path / "url"
    url.write_text(secret + "\n")
    os.chmod(url, 0o644)
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(node_a(alertmanager_webhook_url_file=str(url)))
    assert "mode 0600" in str(err.value) and secret not in str(err.value)
    os.chmod(url, 0o600)
    url.write_text(secret + "\nsecond\n")
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(node_a(alertmanager_webhook_url_file=str(url)))
    assert "one URL" in str(err.value) and secret not in str(err.value)
    for bad in ("https://?token=x", "https://h.example:99999/x", "https://h.ex%zzample/x", "ftp://h.example/x"):
        url.write_text(bad + "\n")
        with pytest.raises(InventoryValidationError) as err:
            validate_hosts(node_a(alertmanager_webhook_url_file=str(url)))
        assert "alertmanager_webhook_url_file" in str(err.value) and bad not in str(err.value)
    url.write_text(secret + "\n")
    cfg = validate_hosts(node_a(alertmanager_webhook_url_file=str(url)))["node-a"]
    conf = yaml.safe_load(mon_files.render_alertmanager(cfg, read_webhook_url(str(url))))
    assert conf["receivers"][1]["webhook_configs"] == [{"url": secret, "send_resolved": True}]
    assert conf["route"]["receiver"] == "webhook"
    assert yaml.safe_load(mon_files.render_alertmanager(cfg, None))["route"]["receiver"] == "none"


def test_files_matching_lists_the_per_head_files_and_nothing_where_the_directory_is_missing(tmp_path):
    """What the monitoring host's clean-up of a head's scrape key and CA reads (facts/host.py FilesMatching)."""
    from facts.host import FilesMatching

    fact = FilesMatching()
    for name in ("scrape-a.key", "scrape-b_c.key", "ca-a.crt", "prometheus.yml"):
        (tmp_path / name).write_text("x")
    (tmp_path / "scrape-dir.key").mkdir()

    def run(directory):
        out = subprocess.run(["sh", "-c", fact.command(str(directory), mon_host.SCRAPE_SECRETS)], capture_output=True,
                             text=True)
        assert out.returncode == 0, out.stderr
        return fact.process(out.stdout.splitlines())

    assert run(tmp_path) == sorted(str(tmp_path / n) for n in ("scrape-a.key", "scrape-b_c.key", "ca-a.crt"))
    assert run(tmp_path / "missing") == []


def test_two_heads_whose_names_share_one_key_file_are_refused():
    """The monitoring host keeps each endpoint head's scrape key under its name made a file word: `a:b` and `a_b`
    would share one file (and overwrite each other's key at every run)."""
    from types import SimpleNamespace

    from deploys.schema.cross_host import monitoring_problems

    head = dict(monitoring_enabled=True, node_exporter_address="192.0.2.40", is_head=True, endpoint_enabled=True,
                endpoint_metrics_client="prometheus")
    watcher = SimpleNamespace(name="m")
    inventory = SimpleNamespace(groups={"monitoring": [watcher]}, get_group=lambda name, default=None: [watcher])
    configs = {"a:b": SimpleNamespace(**head), "a_b": SimpleNamespace(**head), "c": SimpleNamespace(**head)}
    problems = monitoring_problems(inventory, configs)
    assert sorted(p.host for p in problems) == ["a:b", "a_b"]
    assert "a name apart from a_b" in problems[0].expected
    assert monitoring_problems(inventory, {"a:b": configs["a:b"], "c": configs["c"]}) == []


def test_a_stall_fires_not_generating_its_window_after_the_last_token_as_its_text_says(promtool, tmp_path):
    """With the default 600 s: a stall at minute 5 fires at minute 17 (a 2-minute no-token window, then 10 minutes),
    not the 20 it took with a 5-minute rate, and the summary says 12 minutes."""
    me = _me(alert_not_generating_for_s=600)
    series = [(s, "0+600x5 3000x15" if s.startswith("vllm:generation_tokens_total") else v) for s, v in HEALTHY]
    labels = {**N}
    summary = _summary("InferenceNotGenerating", me, labels)
    assert "for about 12 minutes" in summary
    checks = [{"eval_time": "15m", "alertname": "InferenceNotGenerating", "exp_alerts": []},
              {"eval_time": "18m", "alertname": "InferenceNotGenerating",
               "exp_alerts": [{"exp_labels": {**labels, "severity": "critical"}, "exp_annotations": {"summary": summary}}]}]
    out = _run_promtool_test(promtool, tmp_path, me, series, checks)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_service_down_during_a_converges_switch_is_planned_work_and_one_alert_per_host_after(promtool, tmp_path):
    """A converge's switch (the node's switch marker) keeps InferenceServiceDown quiet while the new release loads;
    once the marker goes (the switch ended, or its bound passed) a service still down fires, once for the host,
    however many of its series say so."""
    me = _me()
    down = {f'up{{job="vllm",{L}}}': "1 1 0x18", f'inference_nodes_service_active{{job="node",{L}}}': "1 1 0x18",
            f'inference_nodes_vllm_metrics_ok{{job="node",{L}}}': "1 1 0x18",
            f'inference_nodes_switch_in_progress{{job="node",{L}}}': "0 1 1 1 1 1 1 0x13"}
    series = [(s, down.get(s, v)) for s, v in HEALTHY]
    labels = {**N, "severity": "critical"}
    checks = [{"eval_time": "6m", "alertname": "InferenceServiceDown", "exp_alerts": []},
              {"eval_time": "10m", "alertname": "InferenceServiceDown",
               "exp_alerts": [{"exp_labels": labels, "exp_annotations": {"summary": _summary("InferenceServiceDown", me,
                                                                                                labels)}}]}]
    out = _run_promtool_test(promtool, tmp_path, me, series, checks)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_door_shut_with_no_switch_in_progress_pages_and_a_switch_keeps_it_quiet(promtool, tmp_path):
    """N2: the endpoint's door closes with the switch marker already written (quiet while the converge drains,
    restarts and gates); a converge stopped there leaves the door shut, and once its marker's lease passed with no
    renewal, EndpointClosed pages after `alert_for_s`. A door that closes and opens within a switch never pages."""
    me = _me()
    stopped = {f'inference_nodes_endpoint_closed{{job="node",{L}}}': "0 1x19",
               f'inference_nodes_switch_in_progress{{job="node",{L}}}': "0 1 1 1 1 0x15"}
    series = [(s, stopped.get(s, v)) for s, v in HEALTHY]
    labels = {**N, "job": "node", "severity": "critical"}
    checks = [{"eval_time": f"{m}m", "alertname": "EndpointClosed", "exp_alerts": []} for m in (2, 4, 5)]
    checks += [{"eval_time": "7m", "alertname": "EndpointClosed", "exp_alerts": [
        {"exp_labels": labels, "exp_annotations": {"summary": _summary("EndpointClosed", me, labels)}}]}]
    out = _run_promtool_test(promtool, tmp_path, me, series, checks)
    assert out.returncode == 0, out.stdout + out.stderr
    switched = {f'inference_nodes_endpoint_closed{{job="node",{L}}}': "0 1 1 1 0x16",
                f'inference_nodes_switch_in_progress{{job="node",{L}}}': "0 1 1 1 1 0x15"}
    series = [(s, switched.get(s, v)) for s, v in HEALTHY]
    checks = [{"eval_time": f"{m}m", "alertname": "EndpointClosed", "exp_alerts": []} for m in range(1, 20, 2)]
    out = _run_promtool_test(promtool, tmp_path, me, series, checks)
    assert out.returncode == 0, out.stdout + out.stderr


def test_an_unreadable_journal_between_two_counts_pages_nothing_and_an_application_xid_only_warns(promtool, tmp_path):
    """The Xid series missing for a while (the journal could not be read) and back at the same count fires nothing;
    new application Xids (a killed GPU process) warn and never page as hardware."""
    me = _me()
    hw, other = (f'inference_nodes_gpu_xid_errors{{job="node",kind="{k}",{L}}}' for k in ("hardware", "other"))
    changed = {hw: "2 2 _ _ 2x16", other: "0 0 _ _ 0 0 5x14"}
    series = [(s, changed.get(s, v)) for s, v in HEALTHY]
    labels = {**N, "job": "node", "kind": "other", "severity": "warning"}
    checks = [{"eval_time": f"{m}m", "alertname": "GpuXidHardware", "exp_alerts": []} for m in (3, 5, 7, 12)]
    checks += [{"eval_time": "5m", "alertname": "GpuXidErrors", "exp_alerts": []},
               {"eval_time": "7m", "alertname": "GpuXidErrors", "exp_alerts": [
                   {"exp_labels": labels, "exp_annotations": {"summary": _summary("GpuXidErrors", me, labels)}}]}]
    out = _run_promtool_test(promtool, tmp_path, me, series, checks)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_running_unit_whose_credential_copy_differs_from_what_the_converge_writes_is_restarted():
    """Alertmanager and Prometheus read their configuration and keys through LoadCredential=: systemd's copy made at
    the start is what runs. A hand edit loaded by a restart, then the file put right by a converge, leaves the stamp
    saying the right content was applied; the copy says otherwise."""
    import hashlib

    good, edited = "route: {}\ninhibit_rules: []\n", "route: {}\n"
    copy = mon_host.loaded_path(mon_host.ALERTMANAGER, "alertmanager.yml")
    assert copy == "/run/credentials/inference-nodes-alertmanager.service/alertmanager.yml"

    def info(text):
        return {"user": "root", "group": "root", "mode": 400, "sha1": hashlib.sha1(text.encode()).hexdigest()}

    assert mon_host.loaded_differs({copy: info(edited)}, {copy: good})
    assert not mon_host.loaded_differs({copy: info(good)}, {copy: good})
    assert not mon_host.loaded_differs({copy: None}, {copy: good}), "not running: its start copies the file"
    a, b = (mon_host.loaded_path(mon_host.PROMETHEUS, mon_files.scrape_key_id(h)) for h in ("a", "b"))
    assert mon_host.loaded_differs({a: info("k1\n"), b: None}, {a: "k1\n", b: "k2\n"}), "a key it never loaded"
    assert not mon_host.loaded_differs({}, {}), "no scrape key at all"


def test_prometheus_resends_a_firing_alert_every_evaluation():
    """A reload empties Prometheus's Alertmanager list until discovery fills it; an alert that fires in between is
    dropped and sent again after --rules.alert.resend-delay (1 m by default: the failed reload's own alert reached the
    receiver after 63 s). The unit sets it to the evaluation interval."""
    unit = mon_files.render_prometheus_unit(_me(), [])
    [start] = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert f"--rules.alert.resend-delay={_me().prometheus_scrape_interval_s}s" in start.split()


def test_a_node_new_to_prometheus_joins_at_the_end_of_the_run_that_set_up_its_metrics():
    """known_nodes: what the scrape configuration holds when a run starts. A first converge (no configuration yet)
    scrapes no node until its metrics are set up (monitoring_targets_added at the run's end); a toolkit from before the
    record left every monitored node in it; a node the inventory adds is not known; one it removes is dropped."""
    configs = {"n1": _me(), "n2": _me(monitoring_enabled=True), "n3": _me(monitoring_enabled=True)}
    assert mon_host.known_nodes(configs, {}, prometheus_runs=False) == set()
    assert mon_host.known_nodes(configs, None, prometheus_runs=False) == set()  # (no record: a batched read's None)
    assert mon_host.known_nodes(configs, {}, prometheus_runs=True) == {"n2", "n3"}
    assert mon_host.known_nodes(configs, {"hosts": ["n2", "gone"]}, prometheus_runs=True) == {"n2"}
    assert mon_host.known_nodes(configs, {"hosts": "n2"}, prometheus_runs=True) == {"n2", "n3"}  # (a damaged record)
    assert json.loads(mon_host.scraped_record({"n3", "n2"})) == {"hosts": ["n2", "n3"]}

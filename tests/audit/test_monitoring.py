"""Monitoring (deploys/monitoring/), as the node shows it: node-exporter and the toolkit's metrics timer running on
every node that turns monitoring on, serving fresh toolkit metrics; none of it where monitoring is off; on the host
of the group `monitoring`, Prometheus and Alertmanager running on loopback, with every target the inventory implies
up and every toolkit alert loaded. Read-only: HTTP is read on the node itself (python3's urllib, no curl needed)."""

from __future__ import annotations

import functools
import json
import shlex
import time

import pytest
import yaml

from deploys.monitoring import host as mon_host, host_files as mon_files, node as mon_node, rules as mon_rules
from deploys.inventory import load_inventory
from deploys.schema import NodeConfig, validate_inventory


def _get(node, url: str) -> str:
    """The body of ``url`` fetched on the node (its loopback is not this machine's)."""
    code = f"import urllib.request,sys; sys.stdout.write(urllib.request.urlopen({url!r}, timeout=10).read().decode())"
    return node.host.check_output(f"python3 -c {shlex.quote(code)}")


@functools.cache
def _inventory(path: str):
    inventory = load_inventory(path)
    return inventory, validate_inventory(inventory)


def _watcher(pytestconfig) -> str | None:
    inventory, _ = _inventory(pytestconfig.getoption("inventory"))
    return mon_node.monitoring_host_name(inventory)


@pytest.mark.monitoring_only_host_too
def test_node_metrics_run_where_monitoring_is_on_and_nowhere_else(node):
    exporter = node.host.service(f"{mon_node.EXPORTER}.service")
    timer = node.host.service(f"{mon_node.FACTS}.timer")
    if not getattr(node.cfg, "monitoring_enabled", False):  # (a monitoring-only host runs no node metrics)
        assert not exporter.is_running and not timer.is_running, f"{node.name}: node metrics run, monitoring is off"
        assert not node.host.file(mon_node.FACTS_CONFIG).exists
        return
    assert exporter.is_running and exporter.is_enabled, f"{node.name}: {mon_node.EXPORTER}.service is not running"
    assert timer.is_running and timer.is_enabled, f"{node.name}: {mon_node.FACTS}.timer is not running"
    assert node.host.service(mon_node.DISTRO_UNITS["prometheus-node-exporter"]).is_masked


def test_the_exporter_serves_fresh_toolkit_metrics(node):
    if not node.cfg.monitoring_enabled:
        pytest.skip(f"{node.name}: monitoring is off")
    text = _get(node, f"http://127.0.0.1:{node.cfg.node_exporter_port}/metrics")
    values = {line.split()[0]: float(line.split()[-1]) for line in text.splitlines()
              if line and not line.startswith("#") and "{" not in line}
    assert values.get("node_textfile_scrape_error") == 0, f"{node.name}: node-exporter cannot read the textfile directory"
    written = values.get("inference_nodes_facts_timestamp_seconds")
    assert written, f"{node.name}: no toolkit metrics (inference_nodes_facts_timestamp_seconds) in node-exporter's answer"
    now = float(node.host.check_output("date +%s"))
    stale = 3 * node.cfg.monitoring_facts_interval_s + 60
    assert now - written < stale, f"{node.name}: the toolkit's metrics were written {now - written:.0f} s ago (> {stale} s)"
    if node.cfg.is_head:
        assert "inference_nodes_serving_gate_ok" in values, f"{node.name}: no serving gate verdict among its metrics"


@pytest.mark.monitoring_only_host_too
def test_the_monitoring_host_scrapes_every_target_and_loads_every_alert(node, pytestconfig):
    watcher = _watcher(pytestconfig)
    if node.name != watcher:
        for unit in (mon_host.PROMETHEUS, mon_host.ALERTMANAGER):
            assert not node.host.service(f"{unit}.service").is_running, f"{node.name}: {unit} runs on a host outside " \
                                                                        f"the group {'monitoring'}"
        return
    for unit in (mon_host.PROMETHEUS, mon_host.ALERTMANAGER):
        service = node.host.service(f"{unit}.service")
        assert service.is_running and service.is_enabled, f"{node.name}: {unit}.service is not running"
    _, configs = _inventory(pytestconfig.getoption("inventory"))
    expected = yaml.safe_load(mon_files.render_prometheus(configs, node.cfg, watcher))
    want = {(t, job["job_name"]) for job in expected["scrape_configs"] for s in job["static_configs"] for t in s["targets"]}
    base = mon_host.prometheus_url(node.cfg)
    deadline, down = time.monotonic() + 3 * node.cfg.prometheus_scrape_interval_s + 30, None
    while True:  # a target the converge just added is scraped within a few intervals
        targets = json.loads(_get(node, base + "/api/v1/targets"))["data"]["activeTargets"]
        have = {(t["discoveredLabels"]["__address__"], t["scrapePool"]): t for t in targets}
        down = {f"{a} ({p}): {have[(a, p)]['health']} {have[(a, p)]['lastError']}" if (a, p) in have else f"{a} ({p}): not a target"
                for a, p in want if (a, p) not in have or have[(a, p)]["health"] != "up"}
        if not down or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert not down, f"{node.name}: Prometheus targets not up: {'; '.join(sorted(down))}"
    rules = json.loads(_get(node, base + "/api/v1/rules"))["data"]["groups"]
    assert {r["name"] for g in rules for r in g["rules"]} == set(mon_rules.ALERT_KEYS)
    listen = node.host.check_output("ss -Hltnp")
    mine = [line.split()[3] for line in listen.splitlines() if '(("prometheus",' in line or '(("prometheus-aler",' in line]
    assert sorted(mine) == sorted([f"127.0.0.1:{node.cfg.prometheus_port}", f"127.0.0.1:{node.cfg.alertmanager_port}"]), \
        f"{node.name}: Prometheus/Alertmanager listen on {mine}, not loopback only"


@pytest.mark.monitoring_only_host_too
def test_a_monitoring_only_host_runs_nothing_of_an_inference_node(node):
    """A monitoring-only host (the group `monitoring`, no serving cluster) has the toolkit's Prometheus and
    Alertmanager and nothing of a GPU node: no NVIDIA package, no Podman, no service of the toolkit's but those two."""
    if isinstance(node.cfg, NodeConfig):
        return  # an inference node: the other audits say what it runs
    units = node.host.check_output("systemctl list-unit-files 'inference-nodes*' --no-legend --plain | cut -d' ' -f1")
    assert sorted(units.split()) == sorted(f"{u}.service" for u in (mon_host.PROMETHEUS, mon_host.ALERTMANAGER)), units
    packages = node.host.run("dpkg-query -W -f '${db:Status-Abbrev} ${Package}\\n' '*nvidia*' podman 2>/dev/null")
    installed = [line.split()[-1] for line in packages.stdout.splitlines() if line.startswith("ii")]
    assert installed == [], f"{node.name}: a monitoring-only host has {', '.join(installed)} installed"

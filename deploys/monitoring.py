"""See every node working: node-exporter with the toolkit's own metrics on each node that turns monitoring on, and
Prometheus with Alertmanager on the one host of the inventory group `monitoring`, all from distribution packages.

On a node (`monitoring_enabled`): the distribution's `prometheus-node-exporter`, run as the toolkit's own unit
`inference-nodes-node-exporter.service` on loopback and `node_exporter_address` only (the package's own unit, which
listens on every address, is masked before it is installed), with a textfile directory that the stdlib program
files/monitoring/node_facts.py fills atomically on a systemd timer: driver branch and whether the loaded module is
the userspace driver, the last deep verify's and serving gate's verdict and time, free bytes under the model
directory, the service's state and restarts, and GPU figures from nvidia-smi (a cell it reports as `[N/A]`, like
GB10's memory, is left out, never exported as 0).

vLLM's own metrics, decided per head: with the endpoint on, Prometheus scrapes `/metrics` through it (TLS, the
`endpoint_metrics_client` key, loaded into Prometheus with systemd's `LoadCredential=`: no file the `prometheus`
user can read holds it); on the monitoring host itself, on loopback; otherwise the node's facts program reads
vLLM's `/metrics` on loopback and hands its `vllm:` series to node-exporter (the API never leaves loopback for it).

On the monitoring host: `prometheus` and `prometheus-alertmanager` as the toolkit's units on loopback, a scrape
configuration generated from the inventory (adding a node adds its targets), the toolkit's alert rules
(``render_rules``, checked by `promtool` before every start and reload), and Alertmanager posting to the webhook of
`alertmanager_webhook_url_file` (a secret: it may carry a token). A Grafana dashboard for the metrics the toolkit
exports and scrapes is written beside them (``render_dashboard``; Grafana itself is not in Debian or Ubuntu).
"""

from __future__ import annotations

import json
import posixpath
from io import StringIO

import yaml
from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, deploy
from pyinfra.facts.files import Directory, Link

from deploys.endpoint import read_clients, url_host
from deploys.service.door import switch_marker_path
from deploys.service.release import gate_last_path, gate_record_path
from deploys.service.unit import started_from_path
from deploys.inventory import inventory_configs, node_config
from deploys.model.snapshot import RECORD
from deploys.ops import (atomic_put, directory_present, distro_unit_masked, follow_up_done, follow_up_reads,
                         follow_up_stamp, packages_installed, secret_file, unit_running)
from deploys.run.reads import expect, operation, read, service_reads, unit_state
from deploys.schema import NodeConfig
from deploys.schema.control_readers import read_webhook_url
from deploys.schema.monitoring import MONITORING_GROUP, file_word
from deploys.unit_text import command_line, confined, unit_word
from facts.host import FilesMatching, ManagedFiles
from facts.nvidia import SMI_TIMEOUT_S
from files import helper_path

DIR = "/etc/inference-nodes/monitoring"
UNIT_DIR = "/etc/systemd/system"
TEXTFILE_DIR = "/var/lib/inference-nodes/metrics"

EXPORTER = "inference-nodes-node-exporter"
FACTS = "inference-nodes-node-facts"
FACTS_PROGRAM = "/usr/local/lib/inference-nodes/node_facts.py"
FACTS_CONFIG = f"{DIR}/node-facts.json"
NODE_FILES = (FACTS_PROGRAM, FACTS_CONFIG, *(f"{UNIT_DIR}/{u}" for u in (f"{EXPORTER}.service", f"{FACTS}.service",
                                                                         f"{FACTS}.timer")))

PROMETHEUS = "inference-nodes-prometheus"
ALERTMANAGER = "inference-nodes-alertmanager"
PROMETHEUS_CONF = f"{DIR}/prometheus.yml"
RULES = f"{DIR}/alerts.yml"
ALERTMANAGER_CONF = f"{DIR}/alertmanager.yml"  # root 0600: the webhook URL may carry a token (LoadCredential)
DASHBOARD = f"{DIR}/grafana-dashboard.json"
HOST_FILES = (PROMETHEUS_CONF, RULES, ALERTMANAGER_CONF, DASHBOARD,
              *(f"{UNIT_DIR}/{u}.service" for u in (PROMETHEUS, ALERTMANAGER)))
DISTRO_UNITS = {"prometheus-node-exporter": "prometheus-node-exporter.service",
                "prometheus": "prometheus.service", "prometheus-alertmanager": "prometheus-alertmanager.service"}

DEEP_VERIFY_PERIOD_S = {"daily": 86400, "weekly": 7 * 86400, "monthly": 31 * 86400}


# --- on every monitored node ------------------------------------------------------------------------------------

def exporter_addresses(cfg: NodeConfig) -> list[str]:
    """Where the node's exporter listens: loopback, and the address the monitoring host reaches."""
    out = [f"127.0.0.1:{cfg.node_exporter_port}"]
    if cfg.node_exporter_address and cfg.node_exporter_address != "127.0.0.1":
        out.append(f"{url_host(cfg.node_exporter_address)}:{cfg.node_exporter_port}")
    return out


def deep_verify_max_age_s(cfg: NodeConfig) -> int:
    """How old the last deep verify may be: its period and its randomised window, and six hours."""
    return DEEP_VERIFY_PERIOD_S[cfg.model_deep_verify_every] + cfg.model_deep_verify_window_h * 3600 + 6 * 3600


def vllm_scrape(name: str, cfg: NodeConfig, watcher: str | None) -> str:
    """How a head's vLLM metrics reach Prometheus: "endpoint", "loopback" (the head is the monitoring host) or
    "textfile" (the node's facts program reads them on loopback and node-exporter serves them)."""
    if cfg.endpoint_enabled:
        return "endpoint"
    return "loopback" if name == watcher else "textfile"


def render_facts_config(name: str, cfg: NodeConfig, watcher: str | None) -> str:
    republish = cfg.is_head and vllm_scrape(name, cfg, watcher) == "textfile"
    return json.dumps({
        "out": f"{TEXTFILE_DIR}/inference_nodes.prom",
        "module_root": cfg.nvidia_module_root,
        "driver_branch": cfg.nvidia_driver_branch,
        "model_dir": cfg.model_dir,
        "deep_verify_record": RECORD,
        "deep_verify_max_age_s": deep_verify_max_age_s(cfg),
        "interval_s": cfg.monitoring_facts_interval_s,
        "gate_last": gate_last_path(cfg) if cfg.is_head else None,
        "gate_passed": gate_record_path(cfg) if cfg.is_head else None,
        "switch_marker": switch_marker_path(cfg),
        "started_from": started_from_path(cfg) if cfg.is_head else None,
        "service": f"{cfg.container_name}.service",
        "smi_timeout_s": SMI_TIMEOUT_S,
        "vllm_metrics_url": f"http://{url_host(cfg.api_bind_address)}:{cfg.api_port}/metrics" if republish else None,
        "vllm_out": f"{TEXTFILE_DIR}/vllm.prom",
    }, indent=1, sort_keys=True) + "\n"


def render_exporter_unit(cfg: NodeConfig) -> str:
    argv = ["/usr/bin/prometheus-node-exporter", *(f"--web.listen-address={a}" for a in exporter_addresses(cfg)),
            f"--collector.textfile.directory={TEXTFILE_DIR}"]
    return f"""# inference-nodes: node-exporter with the toolkit's own metrics (deploys/monitoring.py)
[Unit]
Description=inference-nodes node-exporter: host, GPU and toolkit metrics for the monitoring host
After=network-online.target
Wants=network-online.target

[Service]
Type=exec
User=prometheus
ExecStart={command_line(argv)}
Restart=on-failure
RestartSec=5
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=read-only
PrivateTmp=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectControlGroups=yes
RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_NETLINK
CapabilityBoundingSet=
LockPersonality=yes

[Install]
WantedBy=multi-user.target
"""


def render_facts_service() -> str:
    return f"""# inference-nodes: the toolkit's own metrics for node-exporter's textfile collector (deploys/monitoring.py)
[Unit]
Description=inference-nodes: write the node's toolkit metrics (driver, deep verify, serving gate, GPUs)

[Service]
Type=oneshot
ExecStart={command_line(["/usr/bin/python3", FACTS_PROGRAM, "--config", FACTS_CONFIG])}
# nvidia-smi in the kernel on a GPU that fell off the bus cannot be killed: the run is stopped, its metrics go
# stale and NodeFactsStale fires, and the next run is not blocked behind it
TimeoutStartSec=120
Nice=10
NoNewPrivileges=yes
ProtectSystem=strict
ReadWritePaths={unit_word(TEXTFILE_DIR)}
ProtectHome=read-only
PrivateTmp=yes
"""


def render_facts_timer(cfg: NodeConfig) -> str:
    return f"""# inference-nodes: how often the node's toolkit metrics are read (deploys/monitoring.py)
[Unit]
Description=inference-nodes: the node's toolkit metrics every {cfg.monitoring_facts_interval_s} s

[Timer]
OnActiveSec=1s
OnUnitActiveSec={cfg.monitoring_facts_interval_s}s
AccuracySec=1s

[Install]
WantedBy=timers.target
"""


@operation()
def node_metrics_removed():
    """Monitoring turned off leaves nothing on the node: units stopped and disabled, files gone."""
    changed = False
    for unit in (f"{FACTS}.timer", f"{EXPORTER}.service"):
        running, enabled = unit_state(host, unit)
        if running or enabled:
            changed = True
            yield StringCommand("systemctl", "disable", "--now", unit)
    present = [p for p, info in read(host, ManagedFiles, paths=NODE_FILES).items() if info is not None]
    if present:
        changed = True
        yield StringCommand("rm", "-f", *present)
        yield StringCommand("rm", "-rf", TEXTFILE_DIR)
    if not changed:
        host.noop("no node metrics on this node")


def node_reads() -> list:
    distro = DISTRO_UNITS["prometheus-node-exporter"]
    return [(ManagedFiles, {"paths": NODE_FILES}), *service_reads(f"{EXPORTER}.service"), *service_reads(f"{FACTS}.timer"),
            (Link, {"path": f"{UNIT_DIR}/{distro}"}), *service_reads(distro), (Directory, {"path": TEXTFILE_DIR}),
            *follow_up_reads("node-exporter-unit", "node-facts-units")]


@deploy("Node metrics")
def node_metrics():
    """node-exporter and the toolkit's own metrics on this node (monitoring_enabled), or none."""
    cfg = node_config()
    expect(node_reads())
    if not cfg.monitoring_enabled:
        node_metrics_removed(name="No node metrics on this node (monitoring_enabled is off)")
        return
    watcher = monitoring_host_name(host.inventory)
    distro_unit_masked(name="Mask the distribution's prometheus-node-exporter.service (the toolkit runs its own unit)",
                       unit=DISTRO_UNITS["prometheus-node-exporter"], ours=f"{EXPORTER}.service")
    packages_installed(name="Install prometheus-node-exporter from the distribution", packages=["prometheus-node-exporter"],
                       recommends=False)
    directory_present(name="The textfile collector's directory", path=TEXTFILE_DIR)
    atomic_put(name="Install the node's metrics program", src=helper_path("monitoring/node_facts.py"), dest=FACTS_PROGRAM,
               mode="0755", batch=NODE_FILES)
    atomic_put(name="Configure the node's metrics program", src=StringIO(render_facts_config(host.name, cfg, watcher)),
               dest=FACTS_CONFIG, batch=NODE_FILES)
    units = {f"{UNIT_DIR}/{FACTS}.service": render_facts_service(), f"{UNIT_DIR}/{FACTS}.timer": render_facts_timer(cfg)}
    for path, text in units.items():
        atomic_put(name=f"Install {posixpath.basename(path)}", src=StringIO(text), dest=path, batch=NODE_FILES,
                   resets=follow_up_stamp("node-facts-units"))
    follow_up_done(name="Apply the metrics timer (daemon-reload, restart)", stamp="node-facts-units",
                   command=f"systemctl daemon-reload && systemctl restart {FACTS}.timer", paths=tuple(units),
                   contents=tuple(units.values()))
    unit_running(name=f"Start and enable {FACTS}.timer", unit=f"{FACTS}.timer")
    exporter = render_exporter_unit(cfg)
    path = f"{UNIT_DIR}/{EXPORTER}.service"
    atomic_put(name=f"Install {EXPORTER}.service", src=StringIO(exporter), dest=path, batch=NODE_FILES,
               resets=follow_up_stamp("node-exporter-unit"))
    follow_up_done(name="Apply node-exporter's unit (daemon-reload, restart)", stamp="node-exporter-unit",
                   command=f"systemctl daemon-reload && systemctl restart {EXPORTER}.service", paths=(path,),
                   contents=(exporter,))
    unit_running(name=f"Start and enable {EXPORTER}.service", unit=f"{EXPORTER}.service")


# --- on the monitoring host -------------------------------------------------------------------------------------

def monitoring_host_name(inventory) -> str | None:
    """The host of the inventory group `monitoring` (validation allows one), or None."""
    if MONITORING_GROUP not in inventory.groups:
        return None
    members = inventory.get_group(MONITORING_GROUP)
    return members[0].name if members else None


def credential(name: str) -> str:
    """Where Prometheus reads a scrape key systemd loaded for it (``LoadCredential=``)."""
    return f"/run/credentials/{PROMETHEUS}.service/{name}"


def scrape_key_id(head: str) -> str:
    return f"scrape-{file_word(head)}.key"


def scrape_key_path(head: str) -> str:
    return f"{DIR}/{scrape_key_id(head)}"


def ca_path(head: str) -> str:
    return f"{DIR}/ca-{file_word(head)}.crt"


def target_labels(name: str, cfg: NodeConfig) -> dict:
    return {"host": name, "cluster": cfg.cluster_name, "role": "head" if cfg.is_head else "worker"}


def render_prometheus(configs: dict[str, NodeConfig], me: NodeConfig, watcher: str) -> str:
    """The scrape configuration, every target from the inventory: each monitored node's exporter (job `node`) and
    each monitored head's vLLM (job `vllm`, labelled with its release: image and model commit)."""
    interval = f"{me.prometheus_scrape_interval_s}s"
    nodes = []
    scrapes = []
    for name, cfg in configs.items():
        if not cfg.monitoring_enabled:
            continue
        address = cfg.node_exporter_address if name != watcher and cfg.node_exporter_address else "127.0.0.1"
        nodes.append({"targets": [f"{url_host(address)}:{cfg.node_exporter_port}"], "labels": target_labels(name, cfg)})
        if not cfg.is_head:
            continue
        how = vllm_scrape(name, cfg, watcher)
        labels = {**target_labels(name, cfg), "image": cfg.image_ref, "model_commit": cfg.model_revision}
        job = {"job_name": f"vllm-{name}", "scrape_interval": interval, "metrics_path": "/metrics",
               "relabel_configs": [{"target_label": "job", "replacement": "vllm"}]}
        if how == "endpoint":
            job.update(scheme="https", authorization={"type": "Bearer", "credentials_file": credential(scrape_key_id(name))},
                       static_configs=[{"targets": [f"{url_host(cfg.endpoint_address)}:{cfg.endpoint_port}"], "labels": labels}])
            if cfg.endpoint_tls_ca:
                job["tls_config"] = {"ca_file": ca_path(name)}
        elif how == "loopback":
            job["static_configs"] = [{"targets": [f"{url_host(cfg.api_bind_address)}:{cfg.api_port}"], "labels": labels}]
        else:
            continue  # served by node-exporter (job `node`) from the node's facts program
        scrapes.append(job)
    conf = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval,
                   "external_labels": {"monitor": "inference-nodes"}},
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{me.alertmanager_port}"]}]}]},
        "rule_files": [RULES],
        "scrape_configs": [{"job_name": "node", "static_configs": nodes}, *scrapes,
                           # the watcher watched: Prometheus and Alertmanager themselves (their reloads, rule
                           # evaluations and notifications, which the meta-alerts read)
                           *({"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{port}"],
                                                                    "labels": {"host": watcher}}]}
                             for job, port in (("prometheus", me.prometheus_port),
                                               ("alertmanager", me.alertmanager_port)))],
    }
    return "# inference-nodes: generated from the inventory (deploys/monitoring.py); edits are overwritten\n" + \
        yaml.safe_dump(conf, sort_keys=False, default_flow_style=False)


def endpoint_scraped(configs: dict[str, NodeConfig], watcher: str) -> list[str]:
    """The monitored heads Prometheus scrapes through their endpoint (each needs its scrape key on the host)."""
    return [name for name, cfg in configs.items()
            if cfg.monitoring_enabled and cfg.is_head and vllm_scrape(name, cfg, watcher) == "endpoint"]


def scrape_keys(configs: dict[str, NodeConfig], watcher: str) -> dict[str, str]:
    """Each head scraped through its endpoint: its monitoring client's key (from the control-node clients file)."""
    return {name: read_clients(configs[name].endpoint_clients_file)[configs[name].endpoint_metrics_client]
            for name in endpoint_scraped(configs, watcher)}


# Alert rules: (name, expression, for key (or None: at once), severity, what it means). Thresholds are the keys
# of the monitoring host; a node's own deep-verify interval comes with its metrics.
def alert_rules(me: NodeConfig) -> list[dict]:
    kv, restarts, disk = me.alert_kv_cache_usage_max, me.alert_restarts_max, me.alert_model_disk_free_min_gib
    # the window in which no token means a stall: short, so the alert fires `alert_not_generating_for_s` after it
    # (a 5-minute rate added 5 minutes to every stall), yet four scrapes long
    stall_s = max(120, 4 * me.prometheus_scrape_interval_s)
    rules = [
        ("NodeExporterDown", 'up{job="node"} == 0', me.alert_for_s, "critical",
         "node-exporter on {{ $labels.host }} does not answer: the node is down, unreachable, or its exporter stopped"),
        # one alert per host whichever way it shows (not one per job); quiet while a converge switches the node
        # (planned: its load may take longer than alert_for_s), loud again once the switch's bound passed
        ("InferenceServiceDown", 'max by (cluster, host) (up{job="vllm"} == bool 0 or inference_nodes_vllm_metrics_ok '
         '== bool 0 or inference_nodes_service_active == bool 0) == 1 unless on (cluster, host) '
         'inference_nodes_switch_in_progress == 1', me.alert_for_s,
         "critical", "the inference service on {{ $labels.host }} is not running, or its vLLM does not answer /metrics (a "
         "scrape through the endpoint also fails on a rotated monitoring key or an expired certificate: see the "
         "target's error in Prometheus)"),
        ("InferenceServiceRestarting", f"increase(inference_nodes_service_restarts_total[15m]) >= {restarts}", 0,
         "warning", "the inference service on {{ $labels.host }} restarted {{ $value }} times in 15 minutes"),
        ("InferenceNotGenerating",
         "sum by (cluster, host) (vllm:num_requests_running + vllm:num_requests_waiting) > 0 unless "
         f"sum by (cluster, host) (increase(vllm:generation_tokens_total[{stall_s}s])) > 0",
         me.alert_not_generating_for_s, "critical",
         f"vLLM on {{{{ $labels.host }}}} holds requests but produced no token for about "
         f"{(stall_s + me.alert_not_generating_for_s) / 60:.0f} minutes: alive (/health 200) but not generating (a "
         "hung engine, an NCCL deadlock)"),
        ("KvCacheHigh", f"vllm:kv_cache_usage_perc > {kv}", me.alert_for_s, "warning",
         f"vLLM's KV cache on {{{{ $labels.host }}}} is over {kv:.0%} used: requests queue or are preempted"),
        ("RequestsWaitingLong", "vllm:num_requests_waiting > 0", me.alert_requests_waiting_for_s, "warning",
         "requests have waited in vLLM's queue on {{ $labels.host }} without a break: more load than the node serves"),
        ("ReleaseNotGated", "inference_nodes_serving_release_gated == 0", me.alert_not_gated_for_s, "critical",
         "{{ $labels.host }} serves a release that has not passed its serving gate (a converge killed between its "
         "restart and its gate, or one that hangs): run a converge, which gates it or rolls back"),
        ("ServingGateFailed", "inference_nodes_serving_gate_ok == 0", 0, "critical",
         "the last serving gate on {{ $labels.host }} failed (see the converge's output and the service journal)"),
        ("DeepVerifyBad", "inference_nodes_deep_verify_ok == 0", 0, "critical",
         "the last deep verify on {{ $labels.host }} found model files that differ from the pinned manifest"),
        ("DeepVerifyOverdue", "time() - inference_nodes_deep_verify_timestamp_seconds > "
         "inference_nodes_deep_verify_max_age_seconds", 0, "warning",
         "the last deep verify on {{ $labels.host }} is older than its schedule allows"),
        # only where nvidia-smi answered: a GPU that fell off the bus also reads as no match, and is no reboot case
        ("DriverModuleMismatch", "inference_nodes_driver_module_matches == 0 and on (host) "
         "inference_nodes_gpu_query_ok == 1", me.alert_for_s, "critical",
         "the loaded NVIDIA kernel module on {{ $labels.host }} is not the installed userspace driver: reboot it"),
        ("GpuNotAnswering", "inference_nodes_gpu_query_ok == 0", me.alert_for_s, "critical",
         "nvidia-smi on {{ $labels.host }} does not answer: a GPU may have fallen off the bus (look for Xid 79 in the "
         "kernel log) or the driver is wedged; a reboot alone may not bring it back"),
        # by kind (files/monitoring/node_facts.py HARDWARE_XIDS); no series while the journal cannot be read, so a
        # hiccup reads as nothing rather than as 0 and then a new error
        ("GpuXidHardware", 'delta(inference_nodes_gpu_xid_errors{kind="hardware"}[10m]) > 0', 0, "critical",
         "{{ $labels.host }} logged a hardware NVIDIA Xid in the last 10 minutes (48, 63/64, 74, 79, 92-95, 119/120: "
         "ECC, row remapping, NVLink, off the bus, GSP): drain the node and read the kernel log"),
        ("GpuXidErrors", 'delta(inference_nodes_gpu_xid_errors{kind="other"}[10m]) > 0', 0, "warning",
         "{{ $labels.host }} logged NVIDIA Xid errors of an application kind in the last 10 minutes (13, 31, 43, 45: a "
         "GPU process faulted or was killed): read them in the kernel log"),
        ("GpuEccUncorrected", "inference_nodes_gpu_ecc_uncorrected_errors > 0", 0, "critical",
         "a GPU of {{ $labels.host }} has uncorrected ECC errors since its driver loaded: drain and replace or reset it"),
        ("NodeFactsMissing", 'up{job="node"} == 1 unless on (host) inference_nodes_facts_timestamp_seconds',
         me.alert_for_s, "warning",
         "node-exporter on {{ $labels.host }} answers without the toolkit's metrics: their timer or file is gone"),
        ("PrometheusConfigReloadFailed", "prometheus_config_last_reload_successful == 0", 0, "critical",
         "Prometheus on {{ $labels.host }} could not load its configuration: it watches with the one before"),
        ("PrometheusRuleEvaluationFailures", "increase(prometheus_rule_evaluation_failures_total[5m]) > 0", 0,
         "critical", "Prometheus on {{ $labels.host }} failed to evaluate alert rules: alerts may not fire"),
        ("AlertmanagerNotificationsFailing", "increase(alertmanager_notifications_failed_total[5m]) > 0", 0,
         "critical", "Alertmanager on {{ $labels.host }} could not deliver notifications (an expired webhook token, an "
         "unreachable receiver): alerts are not reaching anyone"),
        ("MonitoringSelfScrapeDown", 'up{job=~"prometheus|alertmanager"} == 0', me.alert_for_s, "critical",
         "{{ $labels.job }} on {{ $labels.host }} does not answer its own scrape"),
        ("Watchdog", "vector(1)", 0, "none",
         "always firing while Prometheus evaluates rules and Alertmanager delivers: an outside dead man's switch "
         "(alertmanager_watchdog_url_file) pages when it stops arriving"),
        ("NodeFactsStale", "time() - inference_nodes_facts_timestamp_seconds > "
         "3 * inference_nodes_facts_interval_seconds + 120", 0, "warning",
         "the toolkit's metrics on {{ $labels.host }} are stale: its metrics timer stopped or hangs (e.g. nvidia-smi on a "
         "GPU that fell off the bus)"),
        ("ModelDiskNearlyFull", f"inference_nodes_model_free_bytes < {int(disk * 2**30)}", me.alert_for_s, "warning",
         f"under {disk:g} GiB free on {{{{ $labels.host }}}}'s model filesystem: the next model commit will not fit"),
    ]
    out = []
    for name, expr, for_s, severity, summary in rules:
        rule = {"alert": name, "expr": expr}
        if for_s:
            rule["for"] = f"{for_s}s"
        rule.update(labels={"severity": severity}, annotations={"summary": summary})
        out.append(rule)
    return out


ALERT_KEYS = {  # which key tunes each alert (docs/monitoring.md)
    "NodeExporterDown": "alert_for_s", "InferenceServiceDown": "alert_for_s",
    "InferenceServiceRestarting": "alert_restarts_max", "InferenceNotGenerating": "alert_not_generating_for_s",
    "KvCacheHigh": "alert_kv_cache_usage_max, alert_for_s", "RequestsWaitingLong": "alert_requests_waiting_for_s",
    "ServingGateFailed": "(fires at once)", "DeepVerifyBad": "(fires at once)",
    "ReleaseNotGated": "alert_not_gated_for_s",
    "DeepVerifyOverdue": "model_deep_verify_every, model_deep_verify_window_h (per node)",
    "DriverModuleMismatch": "alert_for_s", "ModelDiskNearlyFull": "alert_model_disk_free_min_gib, alert_for_s",
    "GpuNotAnswering": "alert_for_s", "GpuXidHardware": "(fires at once)", "GpuXidErrors": "(fires at once)", "GpuEccUncorrected": "(fires at once)",
    "NodeFactsMissing": "alert_for_s", "PrometheusConfigReloadFailed": "(fires at once)",
    "PrometheusRuleEvaluationFailures": "(fires at once)", "AlertmanagerNotificationsFailing": "(fires at once)",
    "MonitoringSelfScrapeDown": "alert_for_s", "Watchdog": "alertmanager_watchdog_url_file (always firing)",
    "NodeFactsStale": "monitoring_facts_interval_s (per node)",
}


def render_rules(me: NodeConfig) -> str:
    return "# inference-nodes: the toolkit's alerts (deploys/monitoring.py); edits are overwritten\n" + \
        yaml.safe_dump({"groups": [{"name": "inference-nodes", "rules": alert_rules(me)}]}, sort_keys=False, width=200)


# What Prometheus and Alertmanager export about themselves that the meta-alerts read (the node tier finds each in the
# real ones)
SELF_METRICS = ("prometheus_config_last_reload_successful", "prometheus_rule_evaluation_failures_total",
                "alertmanager_notifications_failed_total")
WATCHDOG_REPEAT = "5m"  # how often the Watchdog reaches the dead man's switch (set its period above this)


def render_alertmanager(me: NodeConfig, webhook: str | None, watchdog: str | None = None) -> str:
    """The route: every alert to the webhook, but the always-firing Watchdog to its own receiver, the outside dead
    man's switch (``watchdog``; none: nowhere), every WATCHDOG_REPEAT."""
    wait = me.alertmanager_group_wait_s
    route = {"receiver": "webhook" if webhook else "none", "group_by": ["alertname", "cluster", "host"],
             "group_wait": f"{wait}s", "group_interval": f"{max(10, 2 * wait)}s",
             "repeat_interval": f"{me.alertmanager_repeat_interval_h}h",
             "routes": [{"receiver": "watchdog" if watchdog else "none", "matchers": ['alertname="Watchdog"'],
                         "group_wait": "0s", "group_interval": "1m", "repeat_interval": WATCHDOG_REPEAT}]}
    receivers = [{"name": "none"}]
    if webhook:
        receivers.append({"name": "webhook", "webhook_configs": [{"url": webhook, "send_resolved": True}]})
    if watchdog:
        receivers.append({"name": "watchdog", "webhook_configs": [{"url": watchdog, "send_resolved": False}]})
    return yaml.safe_dump({"route": route, "receivers": receivers}, sort_keys=False)


def render_prometheus_unit(me: NodeConfig, keys: list[str]) -> str:
    """Prometheus as `prometheus`, its scrape keys loaded by systemd (LoadCredential: root-only files on disk). The
    configuration is checked by promtool before each start; a reload is checked by the converge's own promtool run
    as root before it (an `ExecReload=` process cannot read the service's credentials: seen with systemd 257)."""
    argv = ["/usr/bin/prometheus", f"--config.file={PROMETHEUS_CONF}", f"--storage.tsdb.path=/var/lib/{PROMETHEUS}",
            f"--storage.tsdb.retention.time={me.prometheus_retention_days}d",
            f"--web.listen-address=127.0.0.1:{me.prometheus_port}"]
    check = command_line(["/usr/bin/promtool", "check", "config", PROMETHEUS_CONF])
    loads = "".join(f"LoadCredential={unit_word(f'{scrape_key_id(h)}:{scrape_key_path(h)}')}\n" for h in keys)
    return f"""# inference-nodes: Prometheus for the inventory's nodes (deploys/monitoring.py)
[Unit]
Description=inference-nodes Prometheus: scrapes the inventory's nodes, evaluates the toolkit's alerts
After=network-online.target
Wants=network-online.target

[Service]
Type=exec
User=prometheus
{loads}ExecStartPre={check}
ExecStart={command_line(argv)}
ExecReload=/bin/kill -HUP $MAINPID
StateDirectory={PROMETHEUS}
Restart=on-failure
RestartSec=5
TimeoutStopSec=60
{confined()}
[Install]
WantedBy=multi-user.target
"""


def render_alertmanager_unit(me: NodeConfig) -> str:
    argv = ["/usr/bin/prometheus-alertmanager", f"--storage.path=/var/lib/{ALERTMANAGER}",
            f"--web.listen-address=127.0.0.1:{me.alertmanager_port}", "--cluster.listen-address="]
    argv_text = command_line(argv[:-1]) + ' "--cluster.listen-address=" --config.file=%d/alertmanager.yml'
    return f"""# inference-nodes: Alertmanager for the toolkit's alerts (deploys/monitoring.py)
[Unit]
Description=inference-nodes Alertmanager: delivers the toolkit's alerts to the inventory's webhook
After=network-online.target
Wants=network-online.target

[Service]
Type=exec
User=prometheus
LoadCredential={unit_word(f'alertmanager.yml:{ALERTMANAGER_CONF}')}
ExecStartPre=/usr/bin/amtool check-config %d/alertmanager.yml
ExecStart={argv_text}
StateDirectory={ALERTMANAGER}
Restart=on-failure
RestartSec=5
{confined()}
[Install]
WantedBy=multi-user.target
"""


# vLLM's metric names the rules and the dashboard read (vLLM >= 0.10: `vllm:kv_cache_usage_perc`, not the removed
# `vllm:gpu_cache_usage_perc`, with which an alert would silently never fire); the node tier checks each against the
# real vLLM through Prometheus.
VLLM_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total",
                "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket")

VLLM_PANELS = [  # (title, expression, unit): vLLM's metric names as this toolkit's vLLM exports them
    ("Requests running / waiting", "sum by (host) (vllm:num_requests_running)", "short"),
    ("Requests waiting", "sum by (host) (vllm:num_requests_waiting)", "short"),
    ("Generated tokens per second", "sum by (host) (rate(vllm:generation_tokens_total[5m]))", "short"),
    ("KV cache usage", "max by (host) (vllm:kv_cache_usage_perc)", "percentunit"),
    ("Time to first token p95", "histogram_quantile(0.95, sum by (le, host) (rate(vllm:time_to_first_token_seconds_bucket[5m])))", "s"),
]
NODE_PANELS = [
    ("Serving gate passed", "inference_nodes_serving_gate_ok", "short"),
    ("Deep verify good", "inference_nodes_deep_verify_ok", "short"),
    ("Driver module matches userspace", "inference_nodes_driver_module_matches", "short"),
    ("Inference service active", "inference_nodes_service_active", "short"),
    ("Model filesystem free", "inference_nodes_model_free_bytes", "bytes"),
    ("GPU utilization", "inference_nodes_gpu_utilization_ratio", "percentunit"),
    ("GPU power", "inference_nodes_gpu_power_watts", "watt"),
    ("GPU temperature", "inference_nodes_gpu_temperature_celsius", "celsius"),
    ("Host memory available (GB10: the GPU's memory too)", "node_memory_MemAvailable_bytes", "bytes"),
]


def render_dashboard() -> str:
    """A Grafana dashboard (JSON model, Prometheus data source chosen on import) of the metrics the toolkit exports
    and scrapes, no others."""
    panels = []
    for i, (title, expr, unit) in enumerate([*VLLM_PANELS, *NODE_PANELS]):
        panels.append({"id": i + 1, "type": "timeseries", "title": title,
                       "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
                       "datasource": {"type": "prometheus", "uid": "${datasource}"},
                       "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                       "targets": [{"refId": "A", "expr": expr, "legendFormat": "{{host}}"}]})
    return json.dumps({
        "title": "inference-nodes", "uid": "inference-nodes", "schemaVersion": 39, "editable": True,
        "time": {"from": "now-6h", "to": "now"}, "refresh": "30s", "tags": ["inference-nodes", "vllm"],
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"}]},
        "panels": panels,
    }, indent=1) + "\n"


@operation()
def monitoring_host_removed():
    """A host no longer in the group `monitoring` runs no Prometheus or Alertmanager of the toolkit's."""
    changed = False
    for unit in (f"{PROMETHEUS}.service", f"{ALERTMANAGER}.service"):
        running, enabled = unit_state(host, unit)
        if running or enabled:
            changed = True
            yield StringCommand("systemctl", "disable", "--now", unit)
    present = [p for p, info in read(host, ManagedFiles, paths=HOST_FILES).items() if info is not None]
    if present:
        changed = True
        yield StringCommand("rm", "-f", *present)
    secrets = read(host, FilesMatching, directory=DIR, patterns=SCRAPE_SECRETS)
    if secrets:
        changed = True
        yield StringCommand("rm", "-f", *map(QuoteString, secrets))
    if not changed:
        host.noop("not the monitoring host")


def host_reads(batch: tuple[str, ...] = HOST_FILES) -> list:
    return [(ManagedFiles, {"paths": batch}), (FilesMatching, {"directory": DIR, "patterns": SCRAPE_SECRETS}),
            *service_reads(f"{PROMETHEUS}.service"),
            *service_reads(f"{ALERTMANAGER}.service"),
            *(r for u in DISTRO_UNITS.values()
              for r in ((Link, {"path": f"{UNIT_DIR}/{u}"}), *service_reads(u))),
            *follow_up_reads("prometheus-unit", "prometheus-reload", "alertmanager-unit")]


SCRAPE_SECRETS = ("scrape-*.key", "ca-*.crt")  # the monitoring host's per-head files


@operation()
def stale_scrape_files_removed(keep: tuple[str, ...]):
    """The scrape key and CA of a head no longer scraped through its endpoint go (a key left behind is a secret left
    behind)."""
    stale = [p for p in read(host, FilesMatching, directory=DIR, patterns=SCRAPE_SECRETS) if p not in keep]
    if not stale:
        host.noop("no scrape key or CA of a head that is not scraped")
        return
    yield StringCommand("rm", "-f", *map(QuoteString, stale))


@deploy("Monitoring host")
def monitoring_host():
    """Prometheus and Alertmanager on the host of the group `monitoring`, scraping every monitored node."""
    me = node_config()
    watcher = monitoring_host_name(host.inventory)
    if watcher != host.name:
        expect(host_reads())
        monitoring_host_removed(name=f"No Prometheus here (not the host of the group {MONITORING_GROUP})")
        return
    configs = inventory_configs(host.inventory)
    keys = scrape_keys(configs, watcher)
    batch = (*HOST_FILES, *(scrape_key_path(h) for h in keys), *(ca_path(h) for h in keys))
    expect(host_reads(batch))
    webhook = read_webhook_url(me.alertmanager_webhook_url_file) if me.alertmanager_webhook_url_file else None
    watchdog = read_webhook_url(me.alertmanager_watchdog_url_file) if me.alertmanager_watchdog_url_file else None
    ours = {"prometheus": PROMETHEUS, "prometheus-alertmanager": ALERTMANAGER, "prometheus-node-exporter": EXPORTER}
    for package in ("prometheus", "prometheus-alertmanager", "prometheus-node-exporter"):  # (an exporter a lab installs)
        distro_unit_masked(name=f"Mask the distribution's {DISTRO_UNITS[package]} (the toolkit runs its own unit)",
                           unit=DISTRO_UNITS[package], ours=f"{ours[package]}.service")
    packages_installed(name="Install Prometheus and Alertmanager from the distribution",
                       packages=["prometheus", "prometheus-alertmanager"], recommends=False)
    for head, key in keys.items():
        secret_file(name=f"Install the key Prometheus reads {head}'s vLLM metrics with (0600, never printed)",
                    src=StringIO(key + "\n"), dest=scrape_key_path(head), batch=batch, private_dir=False)
        if configs[head].endpoint_tls_ca:
            atomic_put(name=f"Install the CA {head}'s endpoint is checked with", src=configs[head].endpoint_tls_ca,
                       dest=ca_path(head), batch=batch)
    alertmanager_conf = render_alertmanager(me, webhook, watchdog)
    secret_file(name="Install Alertmanager's configuration (0600: the webhook URL may carry a token)",
                src=StringIO(alertmanager_conf), dest=ALERTMANAGER_CONF, batch=batch, private_dir=False)
    conf, rules = render_prometheus(configs, me, watcher), render_rules(me)
    atomic_put(name="Install Prometheus's scrape configuration (from the inventory)", src=StringIO(conf),
               dest=PROMETHEUS_CONF, batch=batch)
    atomic_put(name="Install the toolkit's alert rules", src=StringIO(rules), dest=RULES, batch=batch)
    atomic_put(name="Install the Grafana dashboard (for a lab's Grafana to import)", src=StringIO(render_dashboard()),
               dest=DASHBOARD, batch=batch)
    units = {}
    for unit, text in ((PROMETHEUS, render_prometheus_unit(me, list(keys))), (ALERTMANAGER, render_alertmanager_unit(me))):
        path = f"{UNIT_DIR}/{unit}.service"
        units[unit] = (path, text)
        atomic_put(name=f"Install {unit}.service", src=StringIO(text), dest=path, batch=batch,
                   resets=follow_up_stamp(f"{unit.removeprefix('inference-nodes-')}-unit"))
    key_paths = tuple(scrape_key_path(h) for h in keys)
    path, text = units[PROMETHEUS]
    follow_up_done(name="Apply Prometheus's unit and scrape keys (daemon-reload, restart)", stamp="prometheus-unit",
                   command=f"systemctl daemon-reload && systemctl restart {PROMETHEUS}.service",
                   paths=(path, *key_paths), contents=(text, *(keys[h] + "\n" for h in keys)))
    stale_scrape_files_removed(name="Remove the scrape keys and CAs of heads no longer scraped through an endpoint",
                               keep=tuple(scrape_key_path(h) for h in keys) + tuple(
                                   ca_path(h) for h in keys if configs[h].endpoint_tls_ca))
    path, text = units[ALERTMANAGER]
    follow_up_done(name="Apply Alertmanager's unit and configuration (daemon-reload, restart)", stamp="alertmanager-unit",
                   command=f"systemctl daemon-reload && systemctl restart {ALERTMANAGER}.service",
                   paths=(path, ALERTMANAGER_CONF), contents=(text, alertmanager_conf))
    for unit in (ALERTMANAGER, PROMETHEUS):
        unit_running(name=f"Start and enable {unit}.service", unit=f"{unit}.service")
    follow_up_done(name="Reload Prometheus after a change of targets or rules (promtool checks them first)",
                   stamp="prometheus-reload",
                   command=f"/usr/bin/promtool check config {PROMETHEUS_CONF} && systemctl reload {PROMETHEUS}.service",
                   paths=(PROMETHEUS_CONF, RULES), contents=(conf, rules))


def rendered_files(name: str, configs: dict[str, NodeConfig], watcher: str | None) -> dict[str, str]:
    """Node path -> content of every file this component writes on ``name`` (deploys/render.py); secrets named,
    never rendered."""
    cfg, out = configs[name], {}
    if cfg.monitoring_enabled:
        out.update({FACTS_CONFIG: render_facts_config(name, cfg, watcher),
                    f"{UNIT_DIR}/{EXPORTER}.service": render_exporter_unit(cfg),
                    f"{UNIT_DIR}/{FACTS}.service": render_facts_service(),
                    f"{UNIT_DIR}/{FACTS}.timer": render_facts_timer(cfg)})
    if name == watcher:
        keys = endpoint_scraped(configs, watcher)
        out.update({PROMETHEUS_CONF: render_prometheus(configs, cfg, watcher), RULES: render_rules(cfg),
                    DASHBOARD: render_dashboard(),
                    f"{UNIT_DIR}/{PROMETHEUS}.service": render_prometheus_unit(cfg, keys),
                    f"{UNIT_DIR}/{ALERTMANAGER}.service": render_alertmanager_unit(cfg),
                    ALERTMANAGER_CONF: "# not rendered: Alertmanager's route and alertmanager_webhook_url_file's URL (0600)\n"})
        for head in keys:
            out[scrape_key_path(head)] = f"# not rendered: {head}'s endpoint_metrics_client key (0600)\n"
    return out


def prometheus_url(cfg: NodeConfig) -> str:
    return f"http://127.0.0.1:{cfg.prometheus_port}"

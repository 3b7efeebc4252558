"""What the monitoring host runs, rendered (pure, no pyinfra): Prometheus's scrape configuration generated from the
inventory and its unit, Alertmanager's route and unit, and where the per-head scrape keys and CAs go. The step that
installs them: deploys/monitoring/host.py."""

from __future__ import annotations

import yaml

from deploys.endpoint import url_host
from deploys.monitoring.node import DIR, UNIT_DIR, vllm_scrape
from deploys.monitoring.rules import ALERTING_PATH, WATCHDOG_REPEAT
from deploys.schema import NodeConfig
from deploys.schema.control_readers import read_clients
from deploys.schema.monitoring import MonitoringHostKeys, file_word
from deploys.unit_text import command_line, confined, unit_word

PROMETHEUS = "inference-nodes-prometheus"
ALERTMANAGER = "inference-nodes-alertmanager"
PROMETHEUS_CONF = f"{DIR}/prometheus.yml"
RULES = f"{DIR}/alerts.yml"
ALERTMANAGER_CONF = f"{DIR}/alertmanager.yml"  # root 0600: the webhook URL may carry a token (LoadCredential)
DASHBOARD = f"{DIR}/grafana-dashboard.json"
# the monitored nodes Prometheus's scrape configuration holds (JSON {"hosts": [...]}): a node the inventory adds joins
# at the end of the run that set up its metrics, not at its start (deploys/monitoring/host.py known_nodes)
SCRAPED = f"{DIR}/scraped-nodes.json"
HOST_FILES = (PROMETHEUS_CONF, RULES, ALERTMANAGER_CONF, DASHBOARD, SCRAPED,
              *(f"{UNIT_DIR}/{u}.service" for u in (PROMETHEUS, ALERTMANAGER)))



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


def render_prometheus(configs: dict[str, NodeConfig], me: MonitoringHostKeys, watcher: str) -> str:
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
            job["static_configs"] = [{"targets": [f"{url_host(cfg.engine_address)}:{cfg.engine_port}"], "labels": labels}]
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


def render_alertmanager(me: MonitoringHostKeys, webhook: str | None, watchdog: str | None = None) -> str:
    """The route: every alert to the webhook, but the always-firing Watchdog to its own receiver, the outside dead
    man's switch (``watchdog``; none: nowhere), every WATCHDOG_REPEAT; held back while an alert of ALERTING_PATH
    fires, so that the switch pages when the alerting path itself fails."""
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
    inhibit = [{"source_matchers": [f'alertname=~"{"|".join(ALERTING_PATH)}"'],
                "target_matchers": ['alertname="Watchdog"']}]
    return yaml.safe_dump({"route": route, "receivers": receivers, "inhibit_rules": inhibit}, sort_keys=False)


def render_prometheus_unit(me: MonitoringHostKeys, keys: list[str]) -> str:
    """Prometheus as `prometheus`, its scrape keys loaded by systemd (LoadCredential: root-only files on disk). The
    configuration is checked by promtool before each start; a reload is checked by the converge's own promtool run
    as root before it (an `ExecReload=` process cannot read the service's credentials: seen with systemd 257)."""
    argv = ["/usr/bin/prometheus", f"--config.file={PROMETHEUS_CONF}", f"--storage.tsdb.path=/var/lib/{PROMETHEUS}",
            f"--storage.tsdb.retention.time={me.prometheus_retention_days}d",
            f"--web.listen-address=127.0.0.1:{me.prometheus_port}",
            # a reload empties Prometheus's list of Alertmanagers until its discovery fills it again, and an alert
            # that fires meanwhile is dropped and sent again only after this delay (1 m by default: a failed
            # reload's own alert reached the receiver after 63 s; prometheus/prometheus#13064)
            f"--rules.alert.resend-delay={me.prometheus_scrape_interval_s}s"]
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


def render_alertmanager_unit(me: MonitoringHostKeys) -> str:
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

"""Monitoring keys: node-exporter and the toolkit's own metrics on every node that turns them on, and Prometheus
with Alertmanager on the one host of the inventory group `monitoring` (deploys/monitoring/host.py). Which host that is
and whether every monitored node can be reached from it: deploys/schema/cross_host.py (monitoring_problems)."""

from __future__ import annotations

import ipaddress
import re

from pydantic import model_validator

from deploys.schema.base import ComponentKeys, ControlSecret, IpAddress, _key
from deploys.schema.base import KeyRuleError
from deploys.schema.package_manager import PackageManagerKeys

MONITORING_GROUP = "monitoring"  # the inventory group naming the one host that runs Prometheus and Alertmanager


def file_word(host: str) -> str:
    """An inventory name as one word of a file name and a systemd credential id (`LoadCredential=ID:PATH` splits at
    `:`): what the monitoring host keeps a head's scrape key under (validation refuses two names with one word)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", host)


class NodeMetricsKeys(ComponentKeys):
    """Node metrics on every inference node with `monitoring_enabled`."""

    monitoring_enabled: bool = _key(
        False, description="run node-exporter (distribution package) with the toolkit's own metrics (driver, deep "
        "verify, serving gate, GPUs, model disk) on this node, scraped by the host of the inventory group `monitoring`",
    )
    node_exporter_address: IpAddress | None = _key(
        None, description="address node-exporter listens on besides loopback: the one the monitoring host reaches "
        "(one of this node's own addresses, never a wildcard); unset = loopback only (the node is its own monitoring "
        "host)",
    )
    node_exporter_port: int = _key(9100, description="port node-exporter listens on", ge=1, le=65535)
    monitoring_facts_interval_s: int = _key(
        60, description="how often the toolkit's own metrics are read on the node (a systemd timer; at most 60 s: "
        "a head's vLLM metrics may come with them, and the alerts' 5-minute rates need several samples)", ge=5, le=60,
    )
    @model_validator(mode="after")
    def _monitoring_rules(self) -> NodeMetricsKeys:
        if self.node_exporter_address is not None:
            address = ipaddress.ip_address(self.node_exporter_address)
            if address.is_unspecified or address.is_multicast:
                raise KeyRuleError("node_exporter_address", self.node_exporter_address,
                                   "one address of this node (not a wildcard: the exporter listens where the inventory "
                                   "says)")
        return self


class MonitoringHostKeys(ComponentKeys):
    """Prometheus and Alertmanager on the host of the group `monitoring` (an inference node or a host of its own)."""

    prometheus_port: int = _key(9090, description="(monitoring host) port Prometheus listens on, on loopback only",
                                ge=1, le=65535)
    alertmanager_port: int = _key(9093, description="(monitoring host) port Alertmanager listens on, on loopback only",
                                  ge=1, le=65535)
    prometheus_scrape_interval_s: int = _key(
        15, description="(monitoring host) scrape and rule evaluation interval (at most 60 s: the alerts' 5-minute "
        "rates need several samples)", ge=1, le=60,
    )
    prometheus_retention_days: int = _key(30, description="(monitoring host) days of metrics kept", ge=1, le=3650)
    alertmanager_webhook_url_file: ControlSecret | None = _key(
        None, description="(monitoring host) control-node file (0600, outside the repo) holding the one URL Alertmanager "
        "POSTs alerts to (its webhook format; a chat bridge or an incident tool); the URL may carry a token, so it is "
        "never in the inventory or a log. Unset = alerts are shown by Prometheus and Alertmanager only",
    )
    alertmanager_watchdog_url_file: ControlSecret | None = _key(
        None, description="(monitoring host) control-node file (0600, outside the repo) holding the URL of an outside "
        "dead man's switch (Healthchecks.io, Dead Man's Snitch, PagerDuty's, a cron monitor) that the always-firing "
        "Watchdog alert reaches every 5 minutes (Alertmanager's webhook format): it pages when the pings stop, which "
        "nothing inside the lab can. Unset = the Watchdog is delivered nowhere",
    )
    alertmanager_group_wait_s: int = _key(
        30, description="(monitoring host) how long Alertmanager gathers alerts before the first notification",
        ge=0, le=3600,
    )
    alertmanager_repeat_interval_h: int = _key(
        4, description="(monitoring host) how often a firing alert is sent again", ge=1, le=168,
    )
    alert_for_s: int = _key(
        300, description="(monitoring host) how long a condition holds before its alert fires (service down, node "
        "exporter down, KV cache high)", ge=0, le=86400,
    )
    alert_not_generating_for_s: int = _key(
        600, description="(monitoring host) how long the engine may hold requests without producing a token before "
        "InferenceNotGenerating fires", ge=0, le=86400,
    )
    alert_requests_waiting_for_s: int = _key(
        600, description="(monitoring host) how long requests may wait in vLLM's queue without a break before "
        "RequestsWaitingLong fires", ge=0, le=86400,
    )
    alert_not_gated_for_s: int = _key(
        3600, description="(monitoring host) how long a head may serve a release that has not passed its serving gate "
        "before ReleaseNotGated fires (a converge's switch takes the model's load and the gate: keep it above "
        "`service_ready_timeout_sec`)", ge=60, le=7 * 86400,
    )
    alert_kv_cache_usage_max: float = _key(
        0.95, description="(monitoring host) KV cache usage (0-1) above which KvCacheHigh fires after `alert_for_s`",
        gt=0, le=1,
    )
    alert_restarts_max: int = _key(
        3, description="(monitoring host) service restarts within 15 minutes that fire InferenceServiceRestarting",
        ge=1, le=1000,
    )
    alert_model_disk_free_min_gib: float = _key(
        20, description="(monitoring host) free space on a node's model filesystem below which ModelDiskNearlyFull "
        "fires (GiB; at most 1,048,576 = 1 PiB)", ge=0, le=2**20,
    )


class MonitoringKeys(MonitoringHostKeys, NodeMetricsKeys):
    """Node metrics (every node with `monitoring_enabled`), Prometheus and Alertmanager (the `monitoring` host): an
    inference node has both sets of keys."""


class MonitoringHostConfig(PackageManagerKeys, MonitoringHostKeys):
    """A monitoring-only host: in the group `monitoring`, in no serving cluster (no `cluster_name`). It runs
    Prometheus and Alertmanager and nothing of an inference node (no driver, container runtime, model or service),
    so a hang, an Xid or a driver reboot of a GPU node does not silence the lab. Its keys: the monitoring host's and
    the package manager's; deploys/schema/cross_host.py (monitoring_host_data) says which of its data they come from."""

    @model_validator(mode="after")
    def _two_ports(self) -> MonitoringHostConfig:
        if self.prometheus_port == self.alertmanager_port:
            raise KeyRuleError("alertmanager_port", self.alertmanager_port,
                               f"a port apart from prometheus_port ({self.prometheus_port})")
        return self

"""The toolkit's alert rules (``render_rules``: checked by `promtool` before every start and reload), the keys that
tune each, and what Prometheus and Alertmanager export about themselves that the meta-alerts read."""

from __future__ import annotations

import yaml

from deploys.schema.monitoring import MonitoringHostKeys


# Alert rules: (name, expression, for key (or None: at once), severity, what it means). Thresholds are the keys
# of the monitoring host; a node's own deep-verify interval comes with its metrics.
def alert_rules(me: MonitoringHostKeys) -> list[dict]:
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
        ("InferenceServiceRestarting", f"increase(inference_nodes_service_unplanned_restarts_total[15m]) >= {restarts}",
         0, "warning", "the inference service on {{ $labels.host }} restarted by itself {{ $value }} times in 15 "
         "minutes (restarts during a converge's switch are not counted)"),
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
        # the door shut with no switch in progress (its marker gone or past its lease): a converge stopped during its
        # drain or before its gate; clients get JSON 503 until a converge gates what runs and opens it
        ("EndpointClosed", "inference_nodes_endpoint_closed == 1 unless on (cluster, host) "
         "inference_nodes_switch_in_progress == 1", me.alert_for_s, "critical",
         "the endpoint of {{ $labels.host }} answers every request with 503 and no converge is switching it (one was "
         "stopped during its drain or before its gate): run a converge, which gates what runs and opens the door"),
        ("ServingGateFailed", "inference_nodes_serving_gate_ok == 0", 0, "critical",
         "the last serving gate on {{ $labels.host }} failed (see the converge's output and the service journal)"),
        ("DeepVerifyBad", "inference_nodes_deep_verify_ok == 0", 0, "critical",
         "the last deep verify on {{ $labels.host }} found model files of commit {{ $labels.commit }} (the release "
         "that serves) that differ from its manifest"),
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
        ("AlertmanagerConfigReloadFailed", "alertmanager_config_last_reload_successful == 0", 0, "critical",
         "Alertmanager on {{ $labels.host }} could not load its configuration: it routes with the one before"),
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
    "NodeExporterDown": "alert_for_s", "InferenceServiceDown": "alert_for_s", "EndpointClosed": "alert_for_s",
    "InferenceServiceRestarting": "alert_restarts_max", "InferenceNotGenerating": "alert_not_generating_for_s",
    "KvCacheHigh": "alert_kv_cache_usage_max, alert_for_s", "RequestsWaitingLong": "alert_requests_waiting_for_s",
    "ServingGateFailed": "(fires at once)", "DeepVerifyBad": "(fires at once)",
    "ReleaseNotGated": "alert_not_gated_for_s",
    "DeepVerifyOverdue": "model_deep_verify_every, model_deep_verify_window_h (per node)",
    "DriverModuleMismatch": "alert_for_s", "ModelDiskNearlyFull": "alert_model_disk_free_min_gib, alert_for_s",
    "GpuNotAnswering": "alert_for_s", "GpuXidHardware": "(fires at once)", "GpuXidErrors": "(fires at once)", "GpuEccUncorrected": "(fires at once)",
    "NodeFactsMissing": "alert_for_s", "PrometheusConfigReloadFailed": "(fires at once)",
    "PrometheusRuleEvaluationFailures": "(fires at once)", "AlertmanagerNotificationsFailing": "(fires at once)",
    "AlertmanagerConfigReloadFailed": "(fires at once)",
    "MonitoringSelfScrapeDown": "alert_for_s", "Watchdog": "alertmanager_watchdog_url_file (always firing)",
    "NodeFactsStale": "monitoring_facts_interval_s (per node)",
}


def render_rules(me: MonitoringHostKeys) -> str:
    return "# inference-nodes: the toolkit's alerts (deploys/monitoring.py); edits are overwritten\n" + \
        yaml.safe_dump({"groups": [{"name": "inference-nodes", "rules": alert_rules(me)}]}, sort_keys=False, width=200)


# What Prometheus and Alertmanager export about themselves that the meta-alerts read (the node tier finds each in the
# real ones)
SELF_METRICS = ("prometheus_config_last_reload_successful", "prometheus_rule_evaluation_failures_total",
                "alertmanager_notifications_failed_total", "alertmanager_config_last_reload_successful")
WATCHDOG_REPEAT = "5m"  # how often the Watchdog reaches the dead man's switch (set its period above this)
# The alerts that say the alerting path itself is broken. Each may be unable to reach anyone (the failing webhook
# is where it would go), so while one fires Alertmanager holds the Watchdog back and the outside dead man's switch
# pages when its pings stop. Not sent to the switch as well: a ping is all such a service reads, and any request
# to it says "alive".
ALERTING_PATH = ("AlertmanagerNotificationsFailing", "AlertmanagerConfigReloadFailed", "PrometheusConfigReloadFailed",
                 "PrometheusRuleEvaluationFailures", "MonitoringSelfScrapeDown")

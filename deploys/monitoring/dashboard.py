"""A Grafana dashboard for the metrics the toolkit exports and scrapes (Grafana itself is not in Debian or Ubuntu),
and the vLLM metric names the rules and the dashboard read."""

from __future__ import annotations

import json

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

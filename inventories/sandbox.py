"""The reference profiles pointed at throwaway sandbox nodes (tests/sandbox/node.sh), for tests and `make demo`.

Same groups, same group_data as inventories/lab.py; group_data/sandbox.py (this file's own group, applied
last) swaps in the local stand-ins. Only inventory data differs from a real lab, never code paths.
"""

import os
import runpy

_DIR = os.environ.get("SANDBOX_DIR", "/var/tmp/inference-nodes-sandbox")


def _manifest(commit: str) -> dict:
    """The stand-in repo's manifest, once tests/sandbox/nodes.py --manifests generated it from the stand-in hub."""
    path = f"{_DIR}/manifests/deepseek-ai--DeepSeek-V4-Flash-0731@{commit}.json"
    return {"model_manifest": path} if os.path.exists(path) else {}


def _node(name: str, port: int, **data):
    return (name, {
        "ssh_hostname": "127.0.0.1",
        "ssh_port": port,
        "ssh_user": "root",
        "ssh_key": f"{_DIR}/ssh/id_ed25519",
        # Insecure, and only because a throwaway node gets a new host key at every build: never in a real inventory.
        "ssh_strict_host_key_checking": "off",
        "ssh_known_hosts_file": "/dev/null",
        "_sudo": False,
        # three real vLLMs (CPU build) load and compile at once on a 2-core machine
        "service_ready_timeout_sec": 900,
        # the release bench (a rollout's): a profile the sandbox's CPU vLLMs run in seconds
        "release_bench_concurrency": [1, 2], "release_bench_prompts": 4, "release_bench_input_len": 32,
        "release_bench_output_len": 16,
        **data,
    })


def _endpoint(address: str, port: int) -> dict:
    """The head's endpoint on a loopback address of its own (nothing the sandbox starts listens beyond loopback; the
    address stands for the head's LAN address), with a lab CA and client keys made on first use under _DIR."""
    from deploys.endpoint_ca import add_clients, endpoint_certificate, locked

    d = f"{_DIR}/endpoint"
    with locked(d):
        cert, key = endpoint_certificate(d, address, [])
        add_clients(f"{d}/clients", ["demo", "demo-stream", "prometheus"])
    return {"endpoint_enabled": True, "endpoint_address": address, "endpoint_port": port, "endpoint_tls_cert": cert,
            "endpoint_tls_key": key, "endpoint_tls_ca": f"{d}/ca.crt", "endpoint_clients_file": f"{d}/clients",
            "endpoint_metrics_client": "prometheus"}


def _monitoring(address: str, port: int) -> dict:
    """Node metrics on, node-exporter on ``address`` (a loopback address standing for the node's LAN address) and
    its own port (the nodes share this machine's network namespace); short timings so alerts fire in seconds."""
    return {"monitoring_enabled": True, "node_exporter_address": address, "node_exporter_port": port,
            "monitoring_facts_interval_s": 5}


def _monitoring_host() -> dict:
    """Prometheus and Alertmanager on loopback ports of their own, alerts after 10 s, posted to the node tests' local
    webhook listener (tests/sandbox/webhook_listener.py), which also stands for the dead man's switch (its own path),
    through 0600 URL files made on first use under _DIR."""
    files = {}
    for key, name, url in (("alertmanager_webhook_url_file", "webhook-url", "http://127.0.0.1:9199/alerts"),
                           ("alertmanager_watchdog_url_file", "watchdog-url", "http://127.0.0.1:9199/watchdog")):
        files[key] = path = f"{_DIR}/monitoring/{name}"
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(url + "\n")
            os.replace(path + ".tmp", path)
    return {"prometheus_port": 9190, "alertmanager_port": 9193, "prometheus_scrape_interval_s": 2, "alert_for_s": 10,
            "alertmanager_group_wait_s": 1, **files,
            "alert_model_disk_free_min_gib": 1}  # (the machine's own disk: not what the sandbox tests)


_A, _B = "7872f01b1d1fe23eabc4c98b48bffcef5a386062", "9e165c30e2704aec5d9d593cce3eebd58bbef1cb"

# Nodes share this machine's network namespace, so each serves its API (and, in a push fan-out, its model copy)
# on its own loopback port.
# What differs from the lab profiles because the sandbox's vLLM is the CPU build serving a 2048-token model:
# A's script contract gets the CPU-fitting lengths; B's fork-only flags (nvfp4_ds_mla, flashinfer_b12x,
# cudagraph sizes) and its DSpark speculative decoding (the tiny model has no drafter) are replaced by
# upstream flags the tiny model and the gate need.
# (the profile beside this file; a copy of this inventory elsewhere, as the resilience tests make, reads the repo's)
_A_PROFILE = next(p for p in (os.path.join(os.path.dirname(os.path.abspath(__file__)), "group_data/rtx_pro_6000_pair.py"),
                              "inventories/group_data/rtx_pro_6000_pair.py") if os.path.exists(p))
_A_ENV = {**runpy.run_path(_A_PROFILE)["service_env"],
          "MAX_MODEL_LEN": "2048", "MAX_NUM_BATCHED_TOKENS": "2048"}
_CPU_VLLM_ARGS = ["--max-model-len", "2048", "--max-num-seqs", "2", "--enable-auto-tool-choice",
                  "--tool-call-parser", "hermes", "--structured-outputs-config.backend", "xgrammar",
                  "--structured-outputs-config.disable_any_whitespace", "true", "--enable-prompt-tokens-details"]
# B's long-context retrieval gate at what the 2048-token model fits: 1,536 filler words (~1,600 prompt tokens),
# the length tests/sandbox/tiny_model.py checks its copy circuit at (NEEDLE_CHECK_TOKENS)
_B_LONG_CONTEXT = 1536

rtx_pro_6000_pair = [_node("sandbox-a", 2201, api_port=8101, model_peer_port=8731, service_env=_A_ENV, **_manifest(_A),
                           **_endpoint("127.0.0.2", 8441), **_monitoring("127.0.0.2", 9201), **_monitoring_host())]

gb10_dspark = [
    _node("sandbox-b0", 2202, node_rank=0, fabric_address="127.0.1.10", api_port=8102, model_peer_port=8732,
          vllm_args=_CPU_VLLM_ARGS, vllm_speculative_config=None, gate_long_context_tokens=_B_LONG_CONTEXT,
          **_manifest(_B), **_monitoring("127.0.1.10", 9202)),
    _node("sandbox-b1", 2203, node_rank=1, fabric_address="127.0.1.11", api_port=8103, model_peer_port=8733,
          vllm_args=_CPU_VLLM_ARGS, vllm_speculative_config=None, gate_long_context_tokens=_B_LONG_CONTEXT,
          **_manifest(_B), **_monitoring("127.0.1.11", 9203)),
]

# The one host that runs Prometheus and Alertmanager for the inventory (deploys/monitoring/host.py).
monitoring = ["sandbox-a"]

# Each cluster is also a pyinfra group under its cluster_name: `--limit gb10-dspark` selects the cluster's members.
from deploys.inventory import with_cluster_groups  # noqa: E402

with_cluster_groups(globals())

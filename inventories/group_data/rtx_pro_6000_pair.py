"""Reference deployment A: one host, 2x RTX PRO 6000 Blackwell Max-Q 96 GB, Podman + Quadlet (seed 000).

Every value is the write-up's; deliberate differences: the image is pinned by digest (the write-up
pulled `Pull=always`), and MODEL_PATH / CUDA_VISIBLE_DEVICES are derived (model_mount + commit,
gpu_indices) rather than repeated here.
"""

import os

cluster_name = "rtx-pro-6000-pair"
node_arch = "x86_64"
gpu_indices = [0, 1]
tensor_parallel_size = 2

model_repo = "deepseek-ai/DeepSeek-V4-Flash-0731"
model_revision = "7872f01b1d1fe23eabc4c98b48bffcef5a386062"
model_root = "/mnt/data/hf"
model_layout = "hf_cache"

image = "registry.home.arpa/vllm:deepseek-v4"
image_digest = "sha256:64b94299abdd3bcf5bb5050ca91b378f9ee4e0b0eff4748375b95352371d7cb2"
image_upstream = "voipmonitor/vllm:gilded-gnosis-v20-vllmf5981f1-si2b9bf2a-fi801d57a-cu132-20260803-r24"

container_name = "grandpa"
# The image's own script builds vLLM's arguments from service_env (seed 000): its environment contract.
vllm_launch = "image_env"
container_exec = "/usr/local/bin/serve-ds4-flash.sh"
served_model_name = "grandpa"
container_privileged = True  # not least privilege: kept because the write-up's service started with it
container_ipc_host = True  # so no container_shm_size: Podman refuses both
model_mount = "/models"
jit_cache_dir = "/mnt/data/hf/jit/ds4-v20-r24"
jit_cache_mount = "/cache"
container_tmp_dir = "/mnt/data/hf/tmp/ds4-v20-r24"
container_tmp_mount = "/container-tmp"
api_port = 8000
# Seed 000's clients reach the API from another host (10.10.10.2 -> compute.home.arpa:8000). vLLM stays on loopback
# (api_port 8000 on 127.0.0.1) and the authenticated TLS endpoint serves the LAN on the host's own address
# (`endpoint_address`: the one host's, as inventories/lab.py reaches it), port 8000 as in the write-up: clients
# switch to https and send their key (docs/endpoint.md). Its certificate, key and client keys are control-node files outside the
# repo; make them once with
#   python -m deploys.endpoint_ca ~/.config/inference-nodes/endpoint --address 192.0.2.10 --dns compute.home.arpa \
#       --client workstation --client prometheus
# (INFERENCE_NODES_ENDPOINT_DIR names another folder; a lab with its own CA points these keys at its files).
_ENDPOINT_DIR = os.environ.get("INFERENCE_NODES_ENDPOINT_DIR", os.path.expanduser("~/.config/inference-nodes/endpoint"))
endpoint_enabled = True
endpoint_address = "192.0.2.10"
endpoint_port = 8000
endpoint_tls_cert = f"{_ENDPOINT_DIR}/192.0.2.10.crt"
endpoint_tls_key = f"{_ENDPOINT_DIR}/192.0.2.10.key"
endpoint_tls_ca = f"{_ENDPOINT_DIR}/ca.crt"
endpoint_clients_file = f"{_ENDPOINT_DIR}/clients"
endpoint_metrics_client = "prometheus"
del _ENDPOINT_DIR  # a name, not a key

# The script's contract also has PORT, SERVED_MODEL_NAME, TP_SIZE and MODEL_PATH (the write-up's 8000,
# grandpa, 2, /models/snapshots/<commit>): the unit derives them from api_port, served_model_name,
# tensor_parallel_size and the mount, so they are not repeated here (given here, they must agree).
service_env = {
    "BACKEND": "b12x-a8",
    "DCP_SIZE": "1",
    "DSPARK_DEPTH_MODE": "fixed",
    "DSPARK_TOKENS": "5",
    "GPU_MEMORY_UTILIZATION": "0.975",
    "INSTANTTENSOR_BACKEND": "BUFFERED",
    "KV_OFFLOADING_SIZE": "8",
    "LOAD_FORMAT": "instanttensor",
    "MAX_MODEL_LEN": "262144",
    "MAX_NUM_BATCHED_TOKENS": "8192",
    "MAX_NUM_SEQS": "2",
    "MODE": "dspark",
}

# KV offload: an 8 GiB mmap file in /dev/shm (host RAM), so /dev/shm must hold it.
kv_offload_gib = 8

# Limits (container Ulimit= and [Service] Limit*=): memlock unlimited, nofile 1048576, stack 64 MiB,
# TimeoutStartSec=3600, TimeoutStopSec=120, RestartSec=30 are the schema defaults, i.e. the write-up's.

# Qualification gates (deploys/schema/gate.py GateKeys): the KV capacity the write-up's startup log showed,
# as minimums (seed 000: "GPU KV cache size: 285,336 tokens", "Maximum concurrency for 262,144 tokens per
# request: 1.09x", the journal lines it quotes). The write-up has no concurrency or restart proof.
gate_kv_cache_min_tokens = 285336
gate_kv_min_concurrency = 1.09

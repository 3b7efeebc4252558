"""Reference deployment B: two GB10 nodes, DSpark Graph-8, TP 2 across the nodes over RoCE v2 (seed 004).

Per host (inventory): node_rank (worker 1 starts first, then head 0) and fabric_address (VLLM_HOST_IP;
the head's is MASTER_ADDR on both). NCCL_IB_GID_INDEX is not set here: it differs per node and moves
after reboots, so the service reads it from sysfs at start.
"""

cluster_name = "gb10-dspark"
node_arch = "aarch64"
gpu_indices = [0]
tensor_parallel_size = 2

# DGX OS ships the driver: `nvidia-driver-580-open` with NVIDIA's signed, precompiled modules package
# `linux-modules-nvidia-580-open-<kernel>` (only the open modules work on GB10). Nothing is installed; the
# running kernel, its modules package and the userspace driver are held together (upgrading one without the
# others gives an NVRM API mismatch), and a node where they already differ is refused before any change.
nvidia_driver_source = "preinstalled"
nvidia_kernel_hold = "running"

model_repo = "deepseek-ai/DeepSeek-V4-Flash-0731"
model_revision = "9e165c30e2704aec5d9d593cce3eebd58bbef1cb"
# The write-up only says "the same local path on both nodes"; this path is the toolkit's default.
model_root = "/srv/models/DeepSeek-V4-Flash-0731"
model_layout = "plain"

image = "ghcr.io/anemll/dspark-vllm-gx10:0.1.1"
image_digest = "sha256:a83948492cf13df455170fb42885f5ef4db54fefe0feff0f841ecbff464ac9d8"

# The unit renders vLLM's whole command line (deploys/service/unit.py vllm_argv): the snapshot path,
# --served-model-name, --tensor-parallel-size, --nnodes/--node-rank/--master-addr/--master-port, --headless
# on the worker, --host/--port on the head only. The name is the one seed 004's verify commands ask for.
served_model_name = "deepseek-v4-flash-0731"
# The fabric inside the container: the RDMA devices for NCCL's IB transport over RoCE v2 (the write-up's
# compose passes /dev/infiniband), and a private /dev/shm that holds NCCL's and vLLM's IPC buffers
# (shm_headroom_gib): Podman's default 64 MiB is too small, and a private tmpfs keeps host IPC out (the
# community compose files use ipc: host; a /dev/shm of our own is the least-privilege equivalent here).
container_devices = ["/dev/infiniband"]
container_shm_size = "8g"
# Toolkit's assumption: the image has no `vllm serve` ENTRYPOINT, so Exec= starts with it (vllm_command's
# default). Check with `podman image inspect --format '{{.Config.Entrypoint}}'`; set vllm_command = [] if it has.
jit_cache_dir = "/var/cache/inference-nodes/jit/gb10-dspark"  # VLLM_CACHE_ROOT=/cache/vllm: compile cache kept

service_env = {"VLLM_USE_BREAKABLE_CUDAGRAPH": "0"}
# Fork spellings (upstream vLLM 0.21 has none of these values; the image's own vLLM parses the command line
# before a unit changes and refuses what it does not know):
# - DSpark K5 (seed 004: "DSpark draft tokens: 5"): the toolkit's assumption is that the fork registers DSpark
#   as a speculative method named `dspark` (deployment A's image script takes the same as MODE=dspark,
#   DSPARK_TOKENS=5). The drafter ships with the image/checkpoint, so there is no external `model` to pin.
# - MoE backend `flashinfer_b12x` (seed 004): upstream's `--moe-backend` flag with the fork's value.
# - `--kv-cache-dtype nvfp4_ds_mla` (seed 004): upstream's flag with the fork's value.
vllm_speculative_config = {"method": "dspark", "num_speculative_tokens": 5}
vllm_args = [
    "--moe-backend", "flashinfer_b12x",
    "--kv-cache-dtype", "nvfp4_ds_mla",
    "--max-cudagraph-capture-size", "8",
    "--max-model-len", "1048576",
    "--max-num-seqs", "2",
    "--max-num-batched-tokens", "4096",
    "--gpu-memory-utilization", "0.75",  # do not raise to 0.80 / 8192 tokens without a new pressure test
    "--block-size", "256",
    "--enable-prompt-tokens-details",  # usage.prompt_tokens_details.cached_tokens, for the long-context gate
]
# Seed 004's "exact uncached retrieval: 159,979 prompt tokens, ... cached tokens 0", run as a 160,000-token gate
# (files/serving_gate/needle.py; `pytest tests/audit -m long_context`).
gate_long_context_tokens = 160000

fabric_env = {
    "UCX_MEM_MMAP_HOOK_MODE": "none",
    "UCX_RCACHE_MAX_UNRELEASED": "1024",
}

# Seed 004's qualification gates (deploys/schema/gate.py GateKeys), its figures as minimums:
# - "Stabilized-profile KV capacity observed at startup: 1,372,579 tokens (1.31x the configured full-context
#   ceiling)": the startup log's KV size and its concurrency for the 1,048,576-token --max-model-len;
# - "both requests stayed scheduled (running=2, waiting=0) and each generated 1,005 exact bounded tokens";
#   its 95.48 tok/s aggregate is reported by the gate, not required (the write-up: "not a universal
#   throughput floor");
# - "Production service restart and post-restart smoke: passed" (run with `pytest tests/audit -m drained --qualify`).
gate_kv_cache_min_tokens = 1372579
gate_kv_min_concurrency = 1.31
gate_concurrency = 2
gate_concurrency_tokens = 1005
gate_restart = True

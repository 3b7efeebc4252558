"""Reference deployment C: two DGX Spark nodes, MTP speculative decoding + prefix caching, TP 2 (seed 003).

Seed 003 names neither a model commit nor an image tag or digest, and the toolkit does not invent them:
they are `profile_gaps`, and every deploy of C is refused, naming them, until they are set here (or per host)
to what you verified. The rest of the lab deploys with `--limit rtx_pro_6000_pair --limit gb10_dspark` meanwhile
(docs/operations.md, "Profile C: what the write-up leaves open").
Driver: the 580 branch (590 leaked unified memory and deadlocked CUDA graphs on GB10).
"""

cluster_name = "gb10-mtp"
node_arch = "aarch64"
gpu_indices = [0]
tensor_parallel_size = 2

profile_gaps = {
    "model_revision": "seed 003 names the repository deepseek-ai/DeepSeek-V4-Flash-0731 but no commit",
    "image": "seed 003 names the community image aidendle94/sparkrun-vllm-ds4-gb10 (vLLM 0.21.1rc1.dev) but no tag",
    "image_digest": "seed 003 gives no digest for the image",
}

# DGX OS ships the driver: `nvidia-driver-580-open` with NVIDIA's signed, precompiled modules package
# `linux-modules-nvidia-580-open-<kernel>` (only the open modules work on GB10). Nothing is installed; the
# running kernel, its modules package and the userspace driver are held together (upgrading one without the
# others gives an NVRM API mismatch), and a node where they already differ is refused before any change.
nvidia_driver_source = "preinstalled"
nvidia_kernel_hold = "running"

model_repo = "deepseek-ai/DeepSeek-V4-Flash-0731"
model_root = "/srv/models/DeepSeek-V4-Flash-0731"
model_layout = "plain"

# No VLLM_USE_V2_MODEL_RUNNER (fails with the reasoning budget) and no --enable-expert-parallel
# (the B12X MoE backend refuses EP). MTP speculative decoding is the image's DeepSeek MTP path.
# Served under the same name as deployment B (same checkpoint): the toolkit's documented choice, so clients
# and the serving gate need no per-deployment name. The same entrypoint assumption as B (vllm_command).
served_model_name = "deepseek-v4-flash-0731"
# The fabric inside the container: the RDMA devices for NCCL's IB transport over RoCE v2 (the write-up's
# compose passes /dev/infiniband), and a private /dev/shm that holds NCCL's and vLLM's IPC buffers
# (shm_headroom_gib): Podman's default 64 MiB is too small, and a private tmpfs keeps host IPC out (the
# community compose files use ipc: host; a /dev/shm of our own is the least-privilege equivalent here).
container_devices = ["/dev/infiniband"]
container_shm_size = "8g"
jit_cache_dir = "/var/cache/inference-nodes/jit/gb10-mtp"  # VLLM_CACHE_ROOT=/cache/vllm: compile cache kept

service_env = {"VLLM_TRITON_MLA_SPARSE": "1"}
# DeepSeek's own MTP head (seed 003: "штатная MTP-спекуляция", acceptance 55-64 %): upstream vLLM 0.21 spells
# it method `mtp` (it maps `deepseek_mtp` to it); the MTP layer is in the target checkpoint, so no external
# draft model is pinned. One speculative token per step is the toolkit's assumption (the write-up gives none).
vllm_speculative_config = {"method": "mtp", "num_speculative_tokens": 1}
vllm_args = [
    "--max-num-seqs", "8",
    "--enable-prefix-caching",
]

# What seed 003 counts, as gates (deploys/schema/gate.py GateKeys): its load peaked at "4 running / 0 waiting"
# with --max-num-seqs 8; its synthetic run at concurrency 8 (144.1 tok/s aggregate, counted from
# usage.completion_tokens: counting stream chunks under MTP had under-reported ~2.5x). The concurrency proof
# takes its 8 (the toolkit's choice of length: the gate's default). It gives no startup KV figure, so no
# KV minimum here, and no restart proof.
gate_concurrency = 8

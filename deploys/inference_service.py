"""Inference service: one Quadlet `.container` unit per node, rendered from inventory for every reference
deployment, valid for the oldest Podman the lab runs (4.9.3, Ubuntu 24.04).

Rendering only, so far: the deploy that installs the units, creates the JIT directories and starts
workers before heads is not built yet (deploys/all.py does not call anything from here).

4.9.3 traps the renderer avoids: an unknown [Container] key makes the generator drop the whole unit (so
every key is checked against files/inference_service/quadlet-container-keys-podman-4.9.3.txt); only the
last `Ulimit=` line counts (so limits go in one `PodmanArgs=` line); `--ipc=host` with a shm size is
refused (validation already rejects the pair).
"""

from __future__ import annotations

import os
import shlex

from deploys.schema import NodeConfig

UNIT_DIR = "/etc/containers/systemd"
GATE = "/usr/local/bin/inference-nodes-model-gate"
ROCE_GID = "/usr/local/bin/inference-nodes-roce-gid"
ROCE_ENV = "/run/inference-nodes/roce.env"
ALLOW_LIST = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "files/inference_service/quadlet-container-keys-podman-4.9.3.txt")
HEADER = "# Managed by inference-nodes (deploys/inference_service.py); local edits are overwritten.\n"


def allowed_container_keys(path: str = ALLOW_LIST) -> set[str]:
    with open(path) as f:
        return {line.strip() for line in f if line.strip() and not line.startswith("#")}


def unit_sections(text: str) -> dict[str, list[tuple[str, str]]]:
    """Parse a systemd/Quadlet unit into {section: [(key, value), ...]} (order and repeats kept)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            sections.setdefault(current, [])
        elif "=" in line and current is not None:
            key, value = line.split("=", 1)
            sections[current].append((key.strip(), value.strip()))
    return sections


def keys_outside_allow_list(text: str, allowed: set[str] | None = None) -> list[str]:
    allowed = allowed if allowed is not None else allowed_container_keys()
    return sorted({k for k, _ in unit_sections(text).get("Container", []) if k not in allowed})


def model_path_in_container(cfg: NodeConfig) -> str:
    if cfg.model_layout == "hf_cache":
        return f"{cfg.model_mount}/snapshots/{cfg.model_revision}"
    return cfg.model_mount


def service_environment(cfg: NodeConfig, head: NodeConfig | None, nodes: int) -> dict[str, str]:
    """The profile's env plus what the toolkit derives: GPUs, model path, offline hub, and for multi-node
    clusters rank, node count, the head's fabric address and this node's own."""
    env = dict(cfg.service_env)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, cfg.gpu_indices))
    env["MODEL_PATH"] = model_path_in_container(cfg)
    env["HF_HUB_OFFLINE"] = "1"
    if nodes > 1:
        env["NODE_RANK"] = str(cfg.node_rank)
        env["NNODES"] = str(nodes)
        env["MASTER_ADDR"] = head.fabric_address if head else ""
        env["VLLM_HOST_IP"] = cfg.fabric_address or ""
        if cfg.node_rank > 0:
            env["HEADLESS"] = "1"
        if cfg.nccl_ib_gid_index is not None:
            env["NCCL_IB_GID_INDEX"] = str(cfg.nccl_ib_gid_index)
    return env


def podman_args(cfg: NodeConfig) -> str:
    memlock = "-1" if cfg.limits_memlock == "unlimited" else str(cfg.limits_memlock)
    args = []
    if cfg.container_ipc_host:
        args.append("--ipc=host")
    if cfg.container_privileged:
        args.append("--privileged")
    args += [f"--ulimit memlock={memlock}:{memlock}", f"--ulimit nofile={cfg.limits_nofile}:{cfg.limits_nofile}",
             f"--ulimit stack={cfg.limits_stack}:{cfg.limits_stack}"]
    return " ".join(args)


def exec_line(cfg: NodeConfig) -> str | None:
    args = []
    if cfg.container_exec:
        args.append(cfg.container_exec)
    args += cfg.vllm_args
    if cfg.vllm_args or not cfg.container_exec:
        args += ["--host", cfg.api_bind_address, "--port", str(cfg.api_port)]
    return " ".join(shlex.quote(a) for a in args) if args else None


def render_container(cfg: NodeConfig, head: NodeConfig | None = None, nodes: int = 1) -> str:
    """The `.container` unit of one node. ``head`` is the cluster's rank-0 config; ``nodes`` its size."""
    memlock = "infinity" if cfg.limits_memlock == "unlimited" else str(cfg.limits_memlock)
    role = "" if nodes == 1 else (" (head, rank 0)" if cfg.node_rank == 0 else f" (worker, rank {cfg.node_rank})")
    out = [HEADER, "[Unit]\n", f"Description=inference-nodes {cfg.cluster_name}{role}\n",
           "After=network-online.target nvidia-cdi-refresh.service\n", "Wants=network-online.target\n",
           "\n[Container]\n", f"ContainerName={cfg.container_name}\n", f"Image={cfg.image_ref}\n",
           # pulled by digest by the container-runtime step; the unit never pulls (the write-up's Pull=always)
           "Pull=never\n", "Network=host\n"]
    out += [f"AddDevice=nvidia.com/gpu={i}\n" for i in cfg.gpu_indices]
    out.append(f"PodmanArgs={podman_args(cfg)}\n")
    if cfg.container_shm_size:
        out.append(f"ShmSize={cfg.container_shm_size}\n")
    if cfg.container_exec:
        out.append("RunInit=true\n")
    model_host = cfg.model_dir if cfg.model_layout == "hf_cache" else cfg.model_root
    out.append(f"Volume={model_host}:{cfg.model_mount}:ro\n")
    if cfg.jit_cache_dir:
        out.append(f"Volume={cfg.jit_cache_dir}:{cfg.jit_cache_mount}\n")
    if cfg.container_tmp_dir:
        out.append(f"Volume={cfg.container_tmp_dir}:{cfg.container_tmp_mount}\n")
    out.append(f"EnvironmentFile={cfg.fabric_env_file}\n")
    fabric = nodes > 1 and cfg.nccl_ib_gid_index is None
    if fabric:
        out.append(f"EnvironmentFile={ROCE_ENV}\n")
    for key, value in sorted(service_environment(cfg, head, nodes).items()):
        out.append(f"Environment={key}={value}\n" if " " not in value else f'Environment="{key}={value}"\n')
    exec_ = exec_line(cfg)
    if exec_:
        out.append(f"Exec={exec_}\n")
    out += ["\n[Service]\n", f"ExecStartPre={GATE}\n"]
    if fabric:  # RoCE v2 GID indices differ per node and move after reboots: read them at every start
        out.append(f"ExecStartPre={ROCE_GID} {ROCE_ENV} {cfg.fabric_address}\n")
    dirs = [d for d in (cfg.jit_cache_dir, cfg.container_tmp_dir) if d]
    if dirs:
        out.append(f"ExecStartPre=/usr/bin/mkdir -p {' '.join(dirs)}\n")
    out += [f"TimeoutStartSec={cfg.service_timeout_start_sec}\n", f"TimeoutStopSec={cfg.service_timeout_stop_sec}\n",
            "Restart=on-failure\n", f"RestartSec={cfg.service_restart_sec}\n", f"LimitMEMLOCK={memlock}\n",
            f"LimitNOFILE={cfg.limits_nofile}\n", f"LimitSTACK={cfg.limits_stack}\n",
            "\n[Install]\n", "WantedBy=multi-user.target\n"]
    return "".join(out)


def render_cluster(configs: dict[str, NodeConfig]) -> dict[str, str]:
    """Every host's unit, with each cluster's head and size resolved."""
    clusters: dict[str, list[NodeConfig]] = {}
    for cfg in configs.values():
        clusters.setdefault(cfg.cluster_name, []).append(cfg)
    out = {}
    for name, cfg in configs.items():
        members = clusters[cfg.cluster_name]
        head = next((c for c in members if c.node_rank == 0), None)
        out[name] = render_container(cfg, head, len(members))
    return out

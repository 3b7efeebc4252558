"""Inference service: one Quadlet `.container` unit per node, rendered from inventory for every reference
deployment, valid for the oldest Podman the lab runs (4.9.3, Ubuntu 24.04).

The deploy installs the unit and its helpers, creates the persistent JIT/tmp directories, and starts
workers (rank > 0) before heads; it restarts a running service only when its fingerprint (unit, fabric
env, image) changed, so a converge leaves a healthy service alone.

4.9.3 traps the renderer avoids: an unknown [Container] key makes the generator drop the whole unit (so
every key is checked against files/inference_service/quadlet-container-keys-podman-4.9.3.txt); only the
last `Ulimit=` line counts (so limits go in one `PodmanArgs=` line); `--ipc=host` with a shm size is
refused (validation already rejects the pair).
"""

from __future__ import annotations

import hashlib
import os
import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import StringCommand, deploy, operation
from pyinfra.facts.server import Command
from pyinfra.facts.systemd import SystemdStatus
from pyinfra.operations import files, systemd

from deploys.host_tuning import render_fabric_env
from deploys.inventory import inventory_configs, node_config
from deploys.model_snapshot import GATE
from deploys.ops import atomic_put
from deploys.schema import ContainerKeys, NodeConfig, cluster_head, clusters, defaults_of

DEFAULTS = defaults_of(ContainerKeys)  # keys, defaults and meanings: README "Inventory keys"

UNIT_DIR = "/etc/containers/systemd"
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


def served_model_name(cfg: NodeConfig) -> str:
    """The name clients ask for: SERVED_MODEL_NAME, `--served-model-name`, else (as vLLM does) the model path."""
    if cfg.service_env.get("SERVED_MODEL_NAME"):
        return cfg.service_env["SERVED_MODEL_NAME"]
    if "--served-model-name" in cfg.vllm_args:
        return cfg.vllm_args[cfg.vllm_args.index("--served-model-name") + 1]
    return model_path_in_container(cfg)


def service_environment(cfg: NodeConfig, head: NodeConfig | None, nodes: int) -> dict[str, str]:
    """The profile's env plus what the toolkit derives: GPUs, model path, offline hub, and for multi-node
    clusters rank, node count, the head's fabric address and this node's own."""
    env = dict(cfg.service_env)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, cfg.gpu_indices))
    env["MODEL_PATH"] = model_path_in_container(cfg)
    env["HF_HUB_OFFLINE"] = "1"
    # where the API must listen, for entrypoints that take it from the environment
    env["INFERENCE_API_HOST"] = cfg.api_bind_address
    env["INFERENCE_API_PORT"] = str(cfg.api_port)
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
    args = shlex.split(cfg.container_exec) if cfg.container_exec else []
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
    by_cluster = clusters(configs)
    out = {}
    for name, cfg in configs.items():
        members = by_cluster[cfg.cluster_name]
        out[name] = render_container(cfg, cluster_head(members), len(members))
    return out


ROCE_HELPER = "/usr/local/lib/inference-nodes/roce_gid.py"
FINGERPRINTS = "/var/lib/inference-nodes"


def cluster_of(cfg: NodeConfig) -> tuple[NodeConfig | None, int]:
    members = clusters(inventory_configs(host.inventory))[cfg.cluster_name]
    return cluster_head(members), len(members)


def fingerprint(unit_text: str, cfg: NodeConfig) -> str:
    """What a restart must follow: the unit, the fabric env it reads, the image."""
    material = unit_text + render_fabric_env(cfg) + cfg.image_ref
    return hashlib.sha256(material.encode()).hexdigest()


@operation()
def service_current(service: str, fingerprint: str, act: bool = True):
    """Start ``service`` if it is down, restart it if its fingerprint changed, else leave it alone.
    The model gate runs first so a bad snapshot is reported here, not only in the journal.

    + service: the generated service name
    + fingerprint: hash of what the running service was started from
    + act: False for hosts whose turn is another operation (workers start before heads)
    """
    if not act:
        host.noop("started in the other rank-ordered step")
        return
    running = host.get_fact(SystemdStatus).get(service)
    stamp = f"{FINGERPRINTS}/{service}.fingerprint"
    started_from = host.get_fact(Command, command=f"cat {stamp} 2>/dev/null || true")
    if running and started_from == fingerprint:
        host.noop(f"{service} running, unchanged")
        return
    yield StringCommand(GATE)
    yield StringCommand("systemctl", "restart" if running else "start", service)
    yield StringCommand("echo", fingerprint, ">", stamp)


@deploy("Inference service", data_defaults=DEFAULTS)
def inference_service():
    cfg: NodeConfig = node_config()
    head, nodes = cluster_of(cfg)
    unit_text = render_container(cfg, head, nodes)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    atomic_put(name="Install the RoCE GID lookup", src=os.path.join(here, "files/inference_service/roce_gid.py"),
              dest=ROCE_HELPER, user="root", group="root", mode="0755", create_remote_dir=True)
    atomic_put(name="Install its start-time wrapper",
              src=StringIO(f"#!/bin/sh\nexec python3 {ROCE_HELPER} \"$@\" --sysfs {cfg.roce_sysfs_root}\n"),
              dest=ROCE_GID, user="root", group="root", mode="0755")
    for path in (cfg.jit_cache_dir, cfg.container_tmp_dir):
        if path:
            files.directory(name="Create the persistent JIT cache and tmp directories", path=path,
                            user="root", group="root", mode="0755")
    files.directory(name="Create the fingerprint directory", path=FINGERPRINTS, user="root", group="root",
                    mode="0755")
    unit = atomic_put(name="Install the Quadlet unit", src=StringIO(unit_text),
                     dest=f"{UNIT_DIR}/{cfg.container_name}.container", user="root", group="root", mode="0644",
                     create_remote_dir=True)
    systemd.daemon_reload(name="Run the Quadlet generator (daemon-reload)", _if=unit.did_change)
    service = f"{cfg.container_name}.service"
    fp = fingerprint(unit_text, cfg)
    service_current(name="Start or update workers (rank > 0) before heads", service=service, fingerprint=fp,
                    act=cfg.node_rank > 0)
    service_current(name="Start or update heads and single nodes", service=service, fingerprint=fp,
                    act=cfg.node_rank == 0)

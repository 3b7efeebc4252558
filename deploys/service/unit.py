"""The inference service's unit: one Quadlet `.container` per node, rendered from inventory for every reference
deployment (pure: no node is read), valid for the oldest Podman the lab runs (4.9.3, Ubuntu 24.04), and the
service's environment file.

4.9.3 traps the renderer avoids: an unknown [Container] key makes the generator drop the whole unit (so
every key is checked against files/inference_service/quadlet-container-keys-podman-4.9.3.txt); only the
last `Ulimit=` line counts (so limits go in one `PodmanArgs=` line); `--ipc=host` with a shm size is
refused (validation already rejects the pair).
"""

from __future__ import annotations

import hashlib
import json
import shlex

from deploys.host_tuning import render_fabric_env
from deploys.model.snapshot import GATE, STAMP
from deploys.ops import content_fingerprint, files_fingerprint_command, follow_up_record_command, staged_path
from deploys.schema import NodeConfig, cluster_head, cluster_of
from deploys.unit_text import command_line, env_file_line
from files import helper_path

UNIT_DIR = "/etc/containers/systemd"
RUN_DIR = "/run/inference-nodes"
ROCE_GID = "/usr/local/bin/inference-nodes-roce-gid"
ROCE_ENV = "/run/inference-nodes/roce.env"
ALLOW_LIST = helper_path("inference_service/quadlet-container-keys-podman-4.9.3.txt")
# The header still names the module before deploys/service/: other text would rewrite every node's unit (a restart of
# every service) on the next converge, so it changes with the unit's next real change.
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
    """The name clients ask for: `served_model_name`, else (as vLLM does) the model path."""
    return cfg.served_model_name or cfg.service_env.get("SERVED_MODEL_NAME") or model_path_in_container(cfg)


def vllm_argv(cfg: NodeConfig, head: NodeConfig | None, nodes: int) -> list[str]:
    """`cli` launch: vLLM's whole command line after `vllm_command`, from typed keys. Multi-node clusters
    get vLLM's own flags (it reads no NODE_RANK/MASTER_ADDR environment); workers serve no API."""
    argv = [model_path_in_container(cfg)]
    if cfg.served_model_name:
        argv += ["--served-model-name", cfg.served_model_name]
    argv += ["--tensor-parallel-size", str(cfg.tensor_parallel_size)]
    if nodes > 1:
        argv += ["--nnodes", str(nodes), "--node-rank", str(cfg.node_rank),
                 "--master-addr", head.fabric_address if head else "", "--master-port", str(cfg.vllm_master_port)]
    if nodes > 1 and not cfg.is_head:
        argv.append("--headless")
    else:
        argv += ["--host", cfg.engine_address, "--port", str(cfg.engine_port)]
    if cfg.vllm_speculative_config is not None:
        argv += ["--speculative-config", json.dumps(cfg.vllm_speculative_config, sort_keys=True, separators=(",", ":"))]
    return argv + list(cfg.vllm_args)


def container_argv(cfg: NodeConfig, head: NodeConfig | None, nodes: int) -> list[str]:
    """What the unit's `Exec=` passes to the image (after its entrypoint)."""
    if cfg.vllm_launch == "image_env":
        return shlex.split(cfg.container_exec or "")
    return list(cfg.vllm_command) + vllm_argv(cfg, head, nodes)


def cuda_devices_env(cfg: NodeConfig) -> dict[str, str]:
    """CUDA's view of `gpu_indices` inside the container. CDI passes only the chosen devices, and CUDA numbers
    what it sees from 0: `gpu_indices = [2, 3]` is `0,1` inside (host indices there match no device and vLLM
    crash-loops; NVIDIA/nvidia-docker#907). A `--privileged` container sees every GPU of the host: host indices,
    in nvidia-smi's order (PCI bus), not CUDA's default fastest-first."""
    if cfg.container_privileged:
        return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, cfg.gpu_indices)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(cfg.gpu_indices)))}


def service_environment(cfg: NodeConfig, head: NodeConfig | None, nodes: int) -> dict[str, str]:
    """The profile's env plus what the toolkit derives. Only variables something reads: GPUs, the offline
    hub, vLLM's compile cache on the JIT volume, this node's fabric address (VLLM_HOST_IP, which vLLM
    reads), a pinned GID index; for `image_env` images, their script's contract (MODEL_PATH, HOST, PORT,
    SERVED_MODEL_NAME, TP_SIZE: the toolkit's reading of seed 000)."""
    env = dict(cfg.service_env)
    env.update(cuda_devices_env(cfg))
    env["HF_HUB_OFFLINE"] = "1"
    if cfg.jit_cache_dir:
        env.setdefault("VLLM_CACHE_ROOT", f"{cfg.jit_cache_mount}/vllm")
    if cfg.vllm_launch == "image_env":
        env["MODEL_PATH"] = model_path_in_container(cfg)
        env["HOST"] = cfg.engine_address
        env.setdefault("PORT", str(cfg.engine_port))
        env.setdefault("TP_SIZE", str(cfg.tensor_parallel_size))
        if cfg.served_model_name:
            env.setdefault("SERVED_MODEL_NAME", cfg.served_model_name)
    if nodes > 1:
        env["VLLM_HOST_IP"] = cfg.fabric_address or ""
        if cfg.nccl_ib_gid_index is not None:
            env["NCCL_IB_GID_INDEX"] = str(cfg.nccl_ib_gid_index)
    return env


def service_env_path(cfg: NodeConfig) -> str:
    """The serving process's environment: a 0600 file Podman reads (`EnvironmentFile=` in `[Container]` is
    `--env-file`), never `Environment=` lines: a unit file is world-readable and `systemctl show` prints its
    environment to every user, and `service_env` values may be secrets under harmless names."""
    return f"/etc/inference-nodes/{cfg.container_name}.service.env"


def render_service_env(cfg: NodeConfig, head: NodeConfig | None, nodes: int) -> str:
    lines = ["# Managed by inference-nodes: the serving process's environment (0600; Podman reads values verbatim)\n"]
    return "".join(lines + [env_file_line(k, v) for k, v in sorted(service_environment(cfg, head, nodes).items())])


def podman_args(cfg: NodeConfig) -> str:
    memlock = cfg.memlock_podman
    args = []
    if cfg.container_ipc_host:
        args.append("--ipc=host")
    if cfg.container_privileged:
        args.append("--privileged")
    args += [f"--ulimit memlock={memlock}:{memlock}", f"--ulimit nofile={cfg.limits_nofile}:{cfg.limits_nofile}",
             f"--ulimit stack={cfg.limits_stack}:{cfg.limits_stack}"]
    return " ".join(args)


def job_probe(cfg: NodeConfig, nodes: int) -> str:
    """The health command that keeps a multi-node job whole (files/inference_service/job_probe.py: a worker
    holds its connection to the head's store, the head holds one per node). When it fails, Podman kills
    the container (`HealthOnFailure=kill`) and `Restart=` brings it back to re-form the job. Quadlet passes
    HealthCmd= on as one string (run with /bin/sh -c); its parts are validated numbers and the image's python."""
    role = f"--role head --nodes {nodes}" if cfg.is_head else "--role worker"
    return f"{cfg.vllm_python} {JOB_PROBE_MOUNT} --port {cfg.vllm_master_port} {role}"


def started_from_path(cfg: NodeConfig) -> str:
    return f"{RUN_DIR}/{cfg.container_name}.started-from"


def cluster_launch_digest(members: list[NodeConfig]) -> str:
    """One hash of every member's launch (command line, environment, image), in rank order."""
    ordered = sorted(members, key=lambda c: c.node_rank)
    head = cluster_head([("", c) for c in ordered])
    material = [[c.image_ref, container_argv(c, head, len(ordered)), sorted(service_environment(c, head, len(ordered)).items())]
                for c in ordered]
    return hashlib.sha256(repr(material).encode()).hexdigest()[:16]


RESTART_STEPS = 5  # systemd's RestartSteps=: restarts over which the delay grows to RESTART_MAX_DELAY_S
RESTART_MAX_DELAY_S = 300


def render_container(cfg: NodeConfig, head: NodeConfig | None = None, nodes: int = 1,
                     members: list[NodeConfig] | None = None) -> str:
    """The `.container` unit of one node. ``head`` is the cluster's rank-0 config; ``nodes`` its size;
    ``members`` every node's config (multi-node: their launch digest is part of each unit, so a change on
    any node restarts the whole job, workers first: a head cannot take a new worker into a running job)."""
    memlock = cfg.memlock_systemd
    role = "" if nodes == 1 else (" (head, rank 0)" if cfg.is_head else f" (worker, rank {cfg.node_rank})")
    out = [HEADER]
    if nodes > 1 and members:
        out.append(f"# cluster launch {cluster_launch_digest(members)}: a change on any node restarts every node\n")
    out += ["[Unit]\n", f"Description=inference-nodes {cfg.cluster_name}{role}\n",
           "After=network-online.target nvidia-cdi-refresh.service\n", "Wants=network-online.target\n",
           # restarts are never rate-limited into a unit that stays down: the growing delay paces them instead
           "StartLimitIntervalSec=0\n",
           "\n[Container]\n", f"ContainerName={cfg.container_name}\n", f"Image={cfg.image_ref}\n",
           # pulled by digest by the container-runtime step; the unit never pulls (the write-up's Pull=always)
           "Pull=never\n", "Network=host\n"]
    out += [f"AddDevice=nvidia.com/gpu={i}\n" for i in cfg.gpu_indices]
    out += [f"AddDevice={device}\n" for device in cfg.container_devices]  # e.g. /dev/infiniband (RoCE)
    out.append(f"PodmanArgs={podman_args(cfg)}\n")
    if cfg.shm_size_rendered:
        out.append(f"ShmSize={cfg.shm_size_rendered}\n")
    out.append("RunInit=true\n")  # an init as PID 1 forwards SIGTERM and reaps vLLM's worker processes
    model_host = cfg.model_dir
    out.append(f"Volume={model_host}:{cfg.model_mount}:ro\n")
    if cfg.jit_cache_dir:
        out.append(f"Volume={cfg.jit_cache_dir}:{cfg.jit_cache_mount}\n")
    if cfg.container_tmp_dir:
        out.append(f"Volume={cfg.container_tmp_dir}:{cfg.container_tmp_mount}\n")
    if nodes > 1:
        out += [f"Volume={JOB_PROBE}:{JOB_PROBE_MOUNT}:ro\n", f"HealthCmd={job_probe(cfg, nodes)}\n", "HealthInterval=10s\n", "HealthRetries=3\n",
                f"HealthStartPeriod={cfg.service_worker_grace_sec}s\n", "HealthOnFailure=kill\n"]
    out.append(f"EnvironmentFile={cfg.fabric_env_file}\n")
    fabric = nodes > 1 and cfg.nccl_ib_gid_index is None
    if fabric:
        out.append(f"EnvironmentFile={ROCE_ENV}\n")
    out.append(f"EnvironmentFile={service_env_path(cfg)}\n")  # last: its values win, as Environment= did
    argv = container_argv(cfg, head, nodes)
    if argv:
        out.append(f"Exec={command_line(argv)}\n")
    out += ["\n[Service]\n", f"ExecStartPre={GATE}\n"]
    if fabric:  # RoCE v2 GID indices differ per node and move after reboots: read them at every start
        out.append(f"ExecStartPre={command_line([ROCE_GID, ROCE_ENV, cfg.fabric_address or ''])}\n")
    dirs = [d for d in (cfg.jit_cache_dir, cfg.container_tmp_dir) if d]
    if dirs:
        out.append(f"ExecStartPre={command_line(['/usr/bin/mkdir', '-p', *dirs])}\n")
    # What this start really runs from: the unit and fabric env as they are now (hand edits included),
    # and the verified snapshot (its stamp: files' size/inode/mtime). A converge compares both with what
    # it renders and what is verified now, and restarts a service started from anything else (a repaired
    # file included: the service may have loaded the bad one).
    started = files_fingerprint_command((f"{UNIT_DIR}/{cfg.container_name}.container", cfg.fabric_env_file,
                                         service_env_path(cfg)))
    record = (f"mkdir -p {RUN_DIR} && {{ {started}; sha256sum < {STAMP} | cut -d' ' -f1; }} > "
              f"{started_from_path(cfg)}")
    out.append(f"ExecStartPre={command_line(['/bin/sh', '-c', record])}\n")
    # Restart on any exit, a clean one too: a head's vLLM exits 0 when a worker's connection drops (a worker's
    # reboot or crash), and a worker's when its head goes; each comes back by itself and the job re-forms with no
    # converge. The delay grows from RestartSec= to RESTART_MAX_DELAY_S over RESTART_STEPS restarts (systemd
    # 254+: Ubuntu 24.04, DGX OS 7, Debian 13); an explicit stop (a converge, the deep verify) restarts nothing.
    out += [f"TimeoutStartSec={cfg.service_timeout_start_sec}\n", f"TimeoutStopSec={cfg.service_timeout_stop_sec}\n",
            "Restart=always\n", f"RestartSec={cfg.service_restart_sec}\n", f"RestartSteps={RESTART_STEPS}\n",
            f"RestartMaxDelaySec={max(RESTART_MAX_DELAY_S, cfg.service_restart_sec)}\n", f"LimitMEMLOCK={memlock}\n",
            f"LimitNOFILE={cfg.limits_nofile}\n", f"LimitSTACK={cfg.limits_stack}\n",
            "\n[Install]\n", "WantedBy=multi-user.target\n"]
    return "".join(out)


def render_cluster(configs: dict[str, NodeConfig]) -> dict[str, str]:
    """Every host's unit, with each cluster's head and size resolved."""
    out = {}
    for name, cfg in configs.items():
        cluster = cluster_of(configs, name)
        out[name] = render_container(cfg, cluster.head, cluster.size, cluster.members)
    return out


QUADLET_STAMP = "inference-service-quadlet"  # follow-up stamp (deploys/ops.py follow_up_done)


def staged_install_command(files: tuple[tuple[str, str], ...]) -> str:
    """Shell: each (live path, sha256 of the content this converge rendered for it) whose staged copy holds exactly
    that content is put in place (copied beside the live file and renamed over it: whole or not at all); a staged
    copy that holds anything else (an older run's) is removed and the live file kept. When one was put in place, the
    Quadlet generator runs and its follow-up is recorded as done for what is in place."""
    moves = "".join(
        f"s={shlex.quote(staged_path(live))}; l={shlex.quote(live)}; "
        f"if [ -f \"$s\" ] && [ \"$(sha256sum < \"$s\" | cut -c1-64)\" = {digest} ]; then "
        f"mkdir -p \"$(dirname \"$l\")\" && cp -p \"$s\" \"$l.inference-nodes-tmp\" && "
        f"mv -f \"$l.inference-nodes-tmp\" \"$l\" || exit 1; moved=1; fi; rm -f \"$s\"; "
        for live, digest in files)
    unit = next(live for live, _ in files if live.endswith(".container"))
    return (f"moved=0; {moves}if [ $moved = 1 ]; then systemctl daemon-reload && "
            f"{follow_up_record_command(QUADLET_STAMP, (unit,))}; fi")


ROCE_HELPER = "/usr/local/lib/inference-nodes/roce_gid.py"
ARGS_CHECK = "/usr/local/lib/inference-nodes/check_vllm_args.py"
JOB_PROBE = "/usr/local/lib/inference-nodes/job_probe.py"
JOB_PROBE_MOUNT = "/run/inference-nodes-job-probe.py"


def fingerprint(unit_text: str, cfg: NodeConfig, head: NodeConfig | None, nodes: int) -> str:
    """What a running service must have started from: the unit and the env files it reads (the image is
    in the unit). The unit records the same hash of the files at every start (`started_from_path`)."""
    return content_fingerprint(unit_text, render_fabric_env(cfg), render_service_env(cfg, head, nodes))

"""Inference service: one Quadlet `.container` unit per node, rendered from inventory for every reference
deployment, valid for the oldest Podman the lab runs (4.9.3, Ubuntu 24.04).

The deploy installs the unit and its helpers, creates the persistent JIT/tmp directories, and starts
workers (rank > 0) before heads; it restarts a running service only when its fingerprint (unit, fabric
env, image) changed, so a converge leaves a healthy service alone. A converge that starts or restarts one
ends only once it serves: workers running, each head answering /health and passing the serving gate
(``service_serving``); the head records the release it passed with.

4.9.3 traps the renderer avoids: an unknown [Container] key makes the generator drop the whole unit (so
every key is checked against files/inference_service/quadlet-container-keys-podman-4.9.3.txt); only the
last `Ulimit=` line counts (so limits go in one `PodmanArgs=` line); `--ipc=host` with a shm size is
refused (validation already rejects the pair).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import shlex
import time
from datetime import datetime, timezone
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, QuoteString, StringCommand, deploy
from pyinfra.facts.files import Directory, Sha256File
from pyinfra.facts.systemd import SystemdStatus

from deploys.failed_release import failure_record, forget_command, json_file_command, record_command
from deploys.model import integrity as model_integrity
from deploys.host_tuning import render_fabric_env
from deploys.run.reads import expect, operation, read, run_on
from deploys.run.state import kept
from deploys.inventory import cluster_member_names, node_cluster, node_config
from deploys.model.snapshot import GATE, MANIFEST, PRUNER, RECORD, STAMP, VERIFIER
from deploys.ops import (atomic_put, directory_present, cluster_all_here, content_fingerprint, files_fingerprint_command, follow_up_done, follow_up_reads,
                         follow_up_stamp, host_failed, secret_file, uses_sudo)
from deploys.endpoint import closed_flag_path
from deploys.serving_gate import (api_url, failed_checks, gate_checks, gate_command, journal_told, parse_readiness,
                                  readiness_command, wait_serving)
from deploys.unit_text import command_line, env_file_line
from deploys.schema import NodeConfig, cluster_head, cluster_of
from facts.containers import GatePassed, ReleasesOnDisk, ServiceStartedFrom
from facts.host import ExistingPaths, ManagedFiles
from files import helper_path
from files.model_snapshot.snapshot_manifest import KEPT_TREES

UNIT_DIR = "/etc/containers/systemd"
RUN_DIR = "/run/inference-nodes"
ROCE_GID = "/usr/local/bin/inference-nodes-roce-gid"
ROCE_ENV = "/run/inference-nodes/roce.env"
ALLOW_LIST = helper_path("inference_service/quadlet-container-keys-podman-4.9.3.txt")
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
        argv += ["--host", cfg.api_bind_address, "--port", str(cfg.api_port)]
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
        env["HOST"] = cfg.api_bind_address
        env.setdefault("PORT", str(cfg.api_port))
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
ROCE_HELPER = "/usr/local/lib/inference-nodes/roce_gid.py"
ARGS_CHECK = "/usr/local/lib/inference-nodes/check_vllm_args.py"
JOB_PROBE = "/usr/local/lib/inference-nodes/job_probe.py"
JOB_PROBE_MOUNT = "/run/inference-nodes-job-probe.py"


def fingerprint(unit_text: str, cfg: NodeConfig, head: NodeConfig | None, nodes: int) -> str:
    """What a running service must have started from: the unit and the env files it reads (the image is
    in the unit). The unit records the same hash of the files at every start (`started_from_path`)."""
    return content_fingerprint(unit_text, render_fabric_env(cfg), render_service_env(cfg, head, nodes))


def args_check_command(cfg: NodeConfig, argv: list[str]) -> str:
    """Shell command that parses ``argv`` with the vLLM inside the pinned image (nothing starts)."""
    # least privilege: it opens no socket; a host whose containers cannot have a network namespace of their own
    # (a nested container cannot bring its loopback up) says so in its inventory (vllm_args_check_network)
    run = ["podman", "run", "--rm", "--pull=never", f"--network={cfg.vllm_args_check_network}", "--cap-drop=all",
           "--security-opt=no-new-privileges", f"--entrypoint={cfg.vllm_python}",
           "-v", f"{ARGS_CHECK}:/run/inference-nodes-check_vllm_args.py:ro", cfg.image_ref,
           "/run/inference-nodes-check_vllm_args.py", *argv]
    refused = f"the vLLM in {cfg.image_ref} refused the new command line; the unit was not changed"
    return f"{shlex.join(run)} || {{ echo {shlex.quote(refused)} >&2; exit 1; }}"


@operation()
def vllm_accepts(unit_path: str, unit_text: str, check: str | None):
    """Before a unit changes, its vLLM command line is parsed by the image's own vLLM; a refusal fails
    this host before the unit is written, so the running service keeps running untouched.

    + unit_path: the installed unit
    + unit_text: the unit about to be installed
    + check: the check command (None: the image's own script builds the arguments, nothing to parse)
    """
    installed = read(host, Sha256File, path=unit_path)
    if installed == hashlib.sha256(unit_text.encode()).hexdigest():
        host.noop("unit unchanged, its command line was checked when it was installed")
        return
    if check is None:
        host.noop("image_env launch: the image's script builds vLLM's arguments from the environment")
        return
    yield StringCommand(check)


def restart_reason(running: bool, start: dict, fingerprint: str) -> str | None:
    """Why the service must be started or restarted now, read from the node (None: it runs what the converge
    renders): down; started from another unit or env (a converge change, or a hand edit that was applied); or
    from another verified snapshot (files repaired since it started: it may have loaded the bad one)."""
    if not running:
        return "not running"
    if start["unit"] != fingerprint:
        return "started from another unit or environment"
    if not start["verified"]:
        return "its snapshot is not verified now"
    if start["snapshot"] != start["verified"]:
        return "the model snapshot changed since it started (repaired files)"
    return None


@operation()
def cluster_changes_whole(unit_path: str, unit_text: str, cluster: str, members: list[str]):
    """A multi-node cluster changes as one: its members' units change only when every member is in this run and
    none failed before the restart (pull, argument check, sync, apt), else every member fails naming the cause,
    with no unit changed (a head cannot take a worker that runs another launch, nor a worker a head's).

    + unit_path: the installed unit
    + unit_text: the unit about to be installed
    + cluster: the cluster's name
    + members: the host names of every member
    """
    if len(members) < 2:
        host.noop("a single-node cluster")
        return
    if read(host, Sha256File, path=unit_path) == hashlib.sha256(unit_text.encode()).hexdigest():
        host.noop("unit unchanged")
        return
    yield FunctionCommand(cluster_all_here, (cluster, members), {})


@operation()
def service_current(service: str, started_from: str, fingerprint: str, record: str, act: bool = True):
    """Start ``service`` if it is down; restart it if it started from anything but the rendered unit and
    fabric env or from another verified snapshot (``restart_reason``); else leave it alone.
    The model gate runs first so a bad snapshot is reported here, not only in the journal.

    + service: the generated service name
    + started_from: the file the unit writes at each start (hash of what it started from)
    + fingerprint: hash of the rendered unit and fabric env
    + record: the head's gate record, removed before a (re)start: the new start has passed no gate yet
    + act: False for hosts whose turn is another operation (workers start before heads)
    """
    if not act:
        host.noop("started in the other rank-ordered step")
        return
    running = read(host, SystemdStatus, services=[service]).get(service)  # one unit, not all of them
    start = read(host, ServiceStartedFrom, record=started_from, stamp=STAMP)
    reason = restart_reason(running, start, fingerprint)
    if reason is None:
        host.noop(f"{service} running, started from the rendered unit and the verified snapshot")
        return
    if running and start["unit"] == fingerprint and start["verified"]:
        logger.info(f"{host.name}: {reason.replace('it started', f'{service} started')}: restarting it")
    yield StringCommand(GATE)
    yield StringCommand("rm", "-f", record)
    yield StringCommand("sh", "-c", QuoteString(switch_marker_command(node_config())))
    yield StringCommand("systemctl", "restart" if running else "start", service)


# Waits for a head's requests in flight to finish (its vLLM's own gauge, summed over models), at most BOUND seconds;
# prints how many still run then.
DRAIN = ("import sys, time, urllib.request as u\n"
         "url, bound, t0 = sys.argv[1], float(sys.argv[2]), time.monotonic()\n"
         "while True:\n"
         "    try:\n"
         "        text = u.urlopen(url, timeout=5).read().decode()\n"
         "        n = sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith('vllm:num_requests_running'))\n"
         "    except Exception:\n"
         "        n = 0\n"
         "    if n <= 0 or time.monotonic() - t0 >= bound:\n"
         "        print(int(n), round(time.monotonic() - t0))\n"
         "        break\n"
         "    time.sleep(1)\n")


def _drain(state, host, cfg: NodeConfig) -> bool:
    ok, out = run_on(host, StringCommand("python3", "-c", QuoteString(DRAIN), f"{api_url(cfg)}/metrics",
                                         str(cfg.endpoint_drain_s)), **({"_sudo": True} if uses_sudo(host) else {}))
    left, waited = (out.stdout.split() + ["?", "?"])[:2] if ok else ("?", "?")
    host.log_styled(f"closed the endpoint to new requests (JSON 503, Retry-After); "
                    + ("no request in flight" if left == "0" and waited == "0" else
                       f"requests in flight finished after {waited} s" if left == "0" else
                       f"{left} request(s) still in flight after endpoint_drain_s={cfg.endpoint_drain_s} s: the "
                       "restart cuts them"), log_func=logger.info)
    return True


@operation()
def endpoint_closed_for_the_switch(service: str, started_from: str, fingerprint: str, flag: str):
    """A head whose service is about to restart (``restart_reason``) closes its endpoint to new API requests first
    (the flag nginx answers a JSON 503 for) and lets the requests in flight finish, at most ``endpoint_drain_s``:
    clients never get an answer from a release that has not passed the gate, nor a cut stream while it can be
    helped. Opened again once a release passed (``_wait_and_gate``, or ``service_serving`` on a later converge).

    + service: the generated service name
    + started_from: the file the unit writes at each start
    + fingerprint: hash of the rendered unit and fabric env
    + flag: the endpoint's closed-door flag (``closed_flag_path``)
    """
    running = read(host, SystemdStatus, services=[service]).get(service)
    start = read(host, ServiceStartedFrom, record=started_from, stamp=STAMP)
    if restart_reason(running, start, fingerprint) is None:
        host.noop(f"{service} is not restarted: its endpoint stays as it is")
        return
    yield StringCommand("install", "-d", "-m", "0755", posixpath.dirname(flag))  # nginx's workers must see the flag
    yield StringCommand("touch", flag)
    if running:  # the requests in flight are the running release's: asked where it listens (its gate record says)
        cfg = node_config()
        passed = read(host, GatePassed, record=gate_record_path(cfg), service=service)["release"] or {}
        yield FunctionCommand(_drain, (as_released(cfg, "", passed)[0],), {})


def switch_marker_path(cfg: NodeConfig) -> str:
    """Written on a node before a converge (re)starts its service, removed once the switch ended (gated, rolled back
    or failed): planned work, which the service-down alert does not page for (files/monitoring/node_facts.py). It
    holds its own bound, so a killed converge's marker stops counting by itself."""
    return f"/var/lib/inference-nodes/{cfg.container_name}.switching.json"


def switch_marker_command(cfg: NodeConfig) -> str:
    bound = cfg.service_ready_timeout_sec + cfg.endpoint_drain_s + 600  # the load, the drain, the gate's own minutes
    path = switch_marker_path(cfg)
    return (f"mkdir -p {posixpath.dirname(path)} && printf '{{\"until\": %s}}\\n' \"$(( $(date +%s) + {bound} ))\" "
            f"> {path}.tmp && mv -f {path}.tmp {path}")


def gate_record_path(cfg: NodeConfig) -> str:
    """Where a head keeps the release its service last passed the serving gate with (persistent: the last good
    release outlives a reboot)."""
    return f"/var/lib/inference-nodes/{cfg.container_name}.gate-passed.json"


def gate_last_path(cfg: NodeConfig) -> str:
    """Where a head keeps the verdict of the last serving gate it ran, passed or failed, with its time and release
    (what the node's metrics report: deploys/monitoring.py)."""
    return f"/var/lib/inference-nodes/{cfg.container_name}.gate-last.json"


def release_of(cfg: NodeConfig, unit_fingerprint: str) -> dict:
    """What the service runs, as the inventory asks for it: the image (by digest), the model commit and its
    manifest, the rendered unit and environment. ``release`` names the whole."""
    manifest = None
    if cfg.model_manifest:
        with open(cfg.model_manifest, "rb") as f:
            manifest = hashlib.sha256(f.read()).hexdigest()
    return {"release": content_fingerprint(unit_fingerprint, manifest or "")[:16], "image": cfg.image_ref,
            "model_repo": cfg.model_repo, "model_revision": cfg.model_revision, "manifest_sha256": manifest,
            "unit": unit_fingerprint, **release_api(cfg)}


def release_api(cfg: NodeConfig) -> dict:
    """Where a release answers and under which name: kept with it, so a rollback gates the release it restored
    where that one listens (a failed release may have changed the port, address or name)."""
    return {"api_bind_address": cfg.api_bind_address, "api_port": cfg.api_port,
            "served_model_name": served_model_name(cfg)}


def as_released(cfg: NodeConfig, model: str, release: dict) -> tuple[NodeConfig, str]:
    """``cfg`` and the served name as ``release`` recorded them (a release kept before they were recorded: as now)."""
    api = {k: release[k] for k in ("api_bind_address", "api_port") if release.get(k) is not None}
    return cfg.model_copy(update=api), release.get("served_model_name") or model


RELEASES_DIR = "/var/lib/inference-nodes/releases"


def release_files(cfg: NodeConfig) -> list[tuple[str, str, str]]:
    """(name, path, mode) of every node file a release consists of beside its image and snapshot: what a rollback
    puts back (the unit and its environments, the model's manifest, verify stamp, deep-verify record, start gate
    and deep-verify service, which name the snapshot the release serves)."""
    out = [("unit.container", f"{UNIT_DIR}/{cfg.container_name}.container", "0644"),
           ("service.env", service_env_path(cfg), "0600"), ("fabric.env", cfg.fabric_env_file, "0600"),
           ("model-manifest.json", MANIFEST, "0644"), ("model-verified.json", STAMP, "0644"),
           ("model-deep-verify.json", RECORD, "0644"), ("model-gate", GATE, "0755"),
           ("model-verify.service", f"{model_integrity.UNIT_DIR}/{model_integrity.UNIT}.service", "0644")]
    if cfg.model_layout == "hf_cache":
        out.append(("refs-main", f"{cfg.model_dir}/refs/main", "0644"))
    return out


def good_release_dir(cfg: NodeConfig) -> str:
    """The last good release of this node's service: a copy of its ``release_files`` taken when it passed the gate."""
    return f"{RELEASES_DIR}/{cfg.container_name}/good"


def release_history_path(cfg: NodeConfig) -> str:
    """The releases that passed the gate on this node, newest last (what pruning keeps the newest of)."""
    return f"{RELEASES_DIR}/{cfg.container_name}/history.json"


def kept_tree(cfg: NodeConfig, revision: str) -> str | None:
    """Where a `plain` layout keeps a release's model commit as hard links (None: `hf_cache` keeps its own)."""
    return None if cfg.model_layout == "hf_cache" else f"{cfg.model_dir}/{KEPT_TREES}/{revision}"


HISTORY_KEYS = ("release", "image", "model_repo", "model_revision", "manifest_sha256", "unit", "passed_at")
def save_good_command(cfg: NodeConfig, passed: dict) -> str:
    """Keep the release that just passed the gate as the last good one: a `plain` layout's model commit linked
    into its kept tree; the release's files copied whole into a new directory (0700), then swapped in by rename,
    so a run killed half-way leaves the previous good release; the release appended to the history."""
    good = good_release_dir(cfg)
    new, old = f"{good}.new", f"{good}.old"
    copies = " && ".join(f"{{ [ ! -e {shlex.quote(path)} ] || cp -p {shlex.quote(path)} {new}/{name}; }}"
                         for name, path, _ in release_files(cfg))  # a file the node never had stays absent
    record = shlex.quote(json.dumps(passed, sort_keys=True) + "\n")
    entry = shlex.quote(json.dumps({k: passed.get(k) for k in HISTORY_KEYS}, sort_keys=True))
    tree = kept_tree(cfg, passed["model_revision"])
    keep = (f"python3 {VERIFIER} {MANIFEST} {shlex.quote(tree)} --link-from {shlex.quote(cfg.snapshot_dir)} "
            f"> /dev/null && " if tree else "")
    return (f"{keep}umask 077 && rm -rf {new} {old} && mkdir -p {new} && {copies} && printf %s {record} > {new}/release.json"
            f" && {{ [ ! -e {good} ] || mv {good} {old}; }} && mv {new} {good} && rm -rf {old} && "
            f"python3 {PRUNER} record {release_history_path(cfg)} {entry}")


def restore_good_command(cfg: NodeConfig, good: dict) -> str:
    """Put the last good release ``good`` back: its files (each through a private temporary and a rename), a
    `plain` layout's model commit linked back from its kept tree; then reload the unit and restart the service."""
    dest = good_release_dir(cfg)
    installs = " && ".join(f"{{ [ ! -e {dest}/{name} ] || {{ install -m {mode} {dest}/{name} {shlex.quote(path)}.rollback && "
                           f"mv -f {shlex.quote(path)}.rollback {shlex.quote(path)}; }}; }}"
                           for name, path, mode in release_files(cfg))
    tree = kept_tree(cfg, str(good.get("model_revision")))
    relink = (f"python3 {VERIFIER} {dest}/model-manifest.json {shlex.quote(cfg.snapshot_dir)} --link-from "
              f"{shlex.quote(tree)} > /dev/null && " if tree else "")
    unit = f"{UNIT_DIR}/{cfg.container_name}.container"
    reloaded = follow_up_stamp(QUADLET_STAMP)  # the generator ran after the unit held these contents (follow_up_done)
    return (f"{relink}umask 077 && {installs} && systemctl daemon-reload && umask 022 && mkdir -p {posixpath.dirname(reloaded)} && "
            f"{files_fingerprint_command((unit,))} > {reloaded}.tmp && mv -f {reloaded}.tmp {reloaded} && "
            f"systemctl restart {cfg.container_name}.service")


def release_named(release: dict) -> str:
    revision = release.get("model_revision") or "?"
    return f"release {release.get('release')} (image {release.get('image')}, {release.get('model_repo')}@{revision[:12]})"


def _serves(host, cfg: NodeConfig, head: bool, model: str, run, progress, sudo: dict,
            abort=None) -> tuple[bool, str, dict]:
    """Wait for the service of ``cfg`` (a head: /health; a worker: running), showing its stage as it goes; on a
    head, then the serving gate. ``abort()``: a reason to stop waiting (a worker failed). (ok, what happened, the
    unit's last read)."""
    ready, why, now = wait_serving(run, cfg, head, cfg.service_ready_timeout_sec, progress, abort=abort)
    if not ready or not head:
        return ready, why, now
    progress(why)
    t0 = time.monotonic()
    ok, out = run_on(host, StringCommand(gate_command(cfg, model)), **sudo)
    checks = gate_checks(out.stdout)
    failed = failed_checks(checks)
    if not ok or failed:
        journal = parse_readiness(run(readiness_command(cfg, head)))["journal"]
        told = "; ".join(failed) if checks else f"{failed[0]} ({out.stderr.strip()[-500:]})"
        return False, (f"{cfg.container_name}.service answers /health but failed the serving gate: {told}"
                       f"{journal_told(journal)}"), now
    return True, f"passed the serving gate ({len(checks)} checks, {time.monotonic() - t0:.1f} s)", {**now, "checks": checks}


class _Member:
    """One member's shell as a head's converge reaches it (its own connection and privilege): the head saves and
    rolls back its workers' releases with its own."""

    def __init__(self, host):
        self.host, self.cfg = host, node_config(host)
        self.sudo = {"_sudo": True} if uses_sudo(host) else {}

    def run(self, command: str) -> str:
        return run_on(self.host, StringCommand(command), **self.sudo)[1].stdout

    def ok(self, command: str) -> bool:
        return run_on(self.host, StringCommand(command), **self.sudo)[0]

    def good(self) -> dict | None:
        """The last good release kept on this member (None: none, or unreadable)."""
        text = self.run(f"cat {good_release_dir(self.cfg)}/release.json 2>/dev/null; true").strip()
        try:
            good = json.loads(text) if text else None
        except ValueError:
            return None
        return good if isinstance(good, dict) else None


def _rollback(me: _Member, workers: list[_Member], release: dict, progress) -> tuple[dict | None, str]:
    """Put the last good release back on every member, workers first (their rank starts before the head's).
    (the good release, None when nothing was rolled back; what happened)."""
    good = me.good()
    if not good:
        return None, "no release has passed the serving gate on this node yet: nothing to roll back to"
    if good.get("release") == release["release"]:
        return None, "this is the last good release itself: nothing older to roll back to"
    kept = {w.host.name: w.good() for w in workers}
    if missing := [name for name, g in kept.items() if (g or {}).get("release") != good.get("release")]:
        return None, (f"{', '.join(missing)} {'does' if len(missing) == 1 else 'do'} not keep the last good "
                      f"{release_named(good)}: nothing rolled back")
    progress(f"{release_named(release)} failed: rolling back to the last good {release_named(good)}"
             + (f", workers first ({', '.join(kept)})" if workers else ""))
    for member in [*workers, me]:
        if not member.ok(restore_good_command(member.cfg, kept.get(member.host.name) or good)):
            return None, f"the rollback to {release_named(good)} could not put its files back on {member.host.name}"
    return good, "rolled back"


def _wait_and_gate(state, host, head: bool, model: str, release: dict, record: str, workers: tuple[str, ...]) -> bool:
    """``_switch_ends``, then the node's switch marker goes (a head's: its workers' too), whatever the outcome."""
    try:
        return _switch_ends(state, host, head, model, release, record, workers)
    finally:
        for h in [host, *(state.inventory.get_host(name) for name in workers)]:
            if h is host or (h in state.active_hosts or h in state.failed_hosts):
                member = _Member(h)
                member.ok(f"rm -f {switch_marker_path(member.cfg)}")


def _switch_ends(state, host, head: bool, model: str, release: dict, record: str, workers: tuple[str, ...]) -> bool:
    """Execute time, on one node: wait until its service serves (``_serves``). A head that passes records the
    release it passed with and keeps its files, and its workers', as the last good release. One that fails is
    handled by ``failed_release_policy`` (rollback: the last good release put back on every member, workers
    first, restarted and gated again), and the host fails saying what failed and what the cluster serves now."""
    me = _Member(host)
    cfg, service = me.cfg, f"{me.cfg.container_name}.service"
    in_run = [state.inventory.get_host(name) for name in workers]
    # a worker outside this run (--limit: a head restarted alone) is not reached: it keeps what it kept; one that
    # failed in this run (its own start, say) is reached: the cluster rolls back as one, it too
    members = [_Member(h) for h in in_run if h in state.active_hosts and h not in state.failed_hosts]
    away = [h.name for h in in_run if h not in state.active_hosts and h not in state.failed_hosts]
    failed_switch = kept(state, "switch_failed", dict)  # workers whose own wait failed in this run

    def worker_failed() -> str | None:
        """Why the job cannot form: a worker of this head failed its switch in this run (its wait runs beside ours)."""
        names = [h.name for h in in_run if h.name in failed_switch or h in state.failed_hosts]
        return f"worker {', '.join(names)} failed its switch in this run (its error is above)" if names else None

    def progress(line: str) -> None:
        host.log_styled(line, log_func=logger.info)

    def passed_record(serving: dict, now: dict) -> dict:
        return {**serving, "invocation": now.get("InvocationID"),
                "passed_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "checks": [c["check"] for c in now.get("checks", [])]}

    def write_json(path: str, data: dict) -> bool:
        """``data`` as the JSON file ``path`` on this head, replaced whole."""
        return me.ok(json_file_command(path, data))

    def write_record(passed: dict) -> bool:
        return write_json(record, passed)

    def write_verdict(passed: bool, of: dict) -> None:
        """The last gate's verdict, for the node's metrics (a failure to write it fails nothing: the converge itself
        reports the gate's verdict)."""
        write_json(gate_last_path(cfg), {"ok": passed, "at": int(time.time()), "release": of.get("release"),
                                         "image": of.get("image"), "model_revision": of.get("model_revision")})

    ok, why, now = _serves(host, cfg, head, model, me.run, progress, me.sudo, worker_failed if head else None)
    if ok and not head:
        progress(why)
        return True
    if head and (ok or "serving gate" in why):
        write_verdict(ok, release)
    if ok:
        passed = passed_record(release, now)
        if not (all(m.ok(f"{save_good_command(m.cfg, passed)} && {forget_command(m.cfg)}") for m in [*members, me])
                and write_record(passed) and me.ok(f"rm -f {closed_flag_path(cfg)}")):
            return host_failed(host, f"{host.name}: the serving gate passed, but the release could not be kept "
                                     f"({record}, {good_release_dir(cfg)})")
        progress(f"{why}: {release_named(release)}, kept as the last good release"
                 + (f" (with its workers {', '.join(m.host.name for m in members)})" if members else ""))
        return True
    failure = f"{host.name}: {why}"
    policy = cfg.failed_release_policy
    if not head:
        kept(state, "switch_failed", dict)[host.name] = why  # its head stops waiting for it and rolls back the cluster
        return host_failed(host, failure)
    # remembered on every member: the next converge does not switch the cluster to it again (deploys/failed_release.py)
    remembered = failure_record(release, why)
    for member in [me, *members]:
        member.ok(record_command(member.cfg, remembered))
    if policy == "keep":
        return host_failed(host, f"{failure}\n{host.name}: {service} left as it is (failed_release_policy=keep)")
    if policy == "stop":
        stopped = all(m.ok(f"systemctl stop {m.cfg.container_name}.service") for m in [me, *members])
        return host_failed(host, f"{failure}\n{host.name}: {service}" + (f" and its workers' services" if members else "")
                           + (" stopped (failed_release_policy=stop)" if stopped else " could not be stopped"))
    if away:
        return host_failed(host, f"{failure}\n{host.name}: its workers {', '.join(away)} are not in this run: nothing "
                                 f"rolled back ({service} left as it is)")
    # a worker that failed its own switch is reached too: the cluster rolls back as one
    members += [_Member(h) for h in in_run if h.name in failed_switch or h in state.failed_hosts
                if h.name not in {m.host.name for m in members}]
    good, what = _rollback(me, members, release, progress)
    if good is None:
        return host_failed(host, f"{failure}\n{host.name}: {what} ({service} left as it is)")
    for member in members:
        back, why_back, _ = _serves(member.host, member.cfg, False, model, member.run, progress, member.sudo)
        if not back:
            return host_failed(host, f"{failure}\n{host.name}: rolled back to {release_named(good)}, but worker "
                                     f"{member.host.name} does not run it: {why_back}")
    cfg_back, model_back = as_released(cfg, model, good)  # gated where the restored release listens, by its name
    back, why_back, now_back = _serves(host, cfg_back, head, model_back, me.run, progress, me.sudo)
    if back or "serving gate" in why_back:
        write_verdict(back, good)
    if not back:
        return host_failed(host, f"{failure}\n{host.name}: rolled back to {release_named(good)}, which failed too: "
                                 f"{why_back}")
    write_record(passed_record({k: v for k, v in good.items() if k in release}, now_back))
    me.ok(f"rm -f {closed_flag_path(cfg)}")  # the restored release passed: the endpoint opens
    on = f" on {host.name} and {', '.join(workers)}" if workers else ""
    return host_failed(host, f"{failure}\n{host.name}: rolled back: {service} serves the last good "
                             f"{release_named(good)} again{on} (it passed the serving gate)")


@operation()
def service_serving(service: str, started_from: str, fingerprint: str, release: dict, record: str, head: bool,
                    workers: tuple[str, ...], model: str):
    """Done means serving: after a start or restart, wait for the service (workers: running; heads: /health,
    bounded by ``service_ready_timeout_sec``, with its stage shown) and pass the serving gate on each head.
    Decided from state: a service that runs what the converge renders, and (a head) whose gate record names this
    release, is left alone, so a no-op converge runs no gate (a restart by systemd, a reboot or an admin is no
    converge change: the audit's `-m serving` checks such a start).

    + service: the generated service name
    + started_from: the file the unit writes at each start
    + fingerprint: hash of the rendered unit and env files
    + release: what the inventory asks the service to run (``release_of``)
    + record: the head's gate record (``gate_record_path``)
    + head: rank 0 (or a single node): serves the API and is gated
    + workers: a head's workers (rank > 0), in rank order: kept and rolled back with it
    + model: the name clients ask for
    """
    running = read(host, SystemdStatus, services=[service]).get(service)
    start = read(host, ServiceStartedFrom, record=started_from, stamp=STAMP)
    current = restart_reason(running, start, fingerprint) is None
    if not head and current:
        host.noop(f"{service} runs the rendered launch (its head's gate checks the job)")
        return
    if head:
        passed = read(host, GatePassed, record=record, service=service)
        last = passed["release"] or {}
        if current and last.get("release") == release["release"]:
            cfg = node_config()
            flag = closed_flag_path(cfg)
            if cfg.endpoint_enabled and read(host, ExistingPaths, paths=(flag,)):  # killed after the gate: open now
                yield StringCommand("rm", "-f", flag)
                return
            host.noop(f"{service} passed the serving gate for release {release['release']} at {last.get('passed_at')}")
            return
    yield FunctionCommand(_wait_and_gate, (head, model, release, record, workers), {})


def prune_reads(cfg: NodeConfig) -> dict:
    """What ``ReleasesOnDisk`` reads with, and ``releases_pruned`` prunes with."""
    return {"pruner": PRUNER, "model_dir": cfg.model_dir, "layout": cfg.model_layout,
            "history": release_history_path(cfg), "kept": cfg.releases_kept, "keep": cfg.model_revision,
            "image": cfg.image_ref}


@operation()
def releases_pruned(pruner: str, model_dir: str, layout: str, history: str, kept: int, keep: str, image: str):
    """Releases beyond ``kept`` leave the disk once a newer one passed the gate: model commits (the `hf_cache`
    snapshots and the blobs no kept snapshot links to; a `plain` layout's kept trees) and images of the
    service's repository that no kept release names (files/model_snapshot/snapshot_releases.py). The commit
    and image the inventory asks for are always kept, and nothing is pruned before a release passed here.

    + pruner: the node's pruner (installed with the verifier)
    + model_dir: the model directory (``NodeConfig.model_dir``)
    + layout: hf_cache or plain
    + history: the node's release history (``release_history_path``)
    + kept: ``releases_kept``
    + keep: the commit the inventory asks for
    + image: the image reference the inventory asks for
    """
    args = dict(pruner=pruner, model_dir=model_dir, layout=layout, history=history, kept=kept, keep=keep, image=image)
    plan = read(host, ReleasesOnDisk, **args)
    if not plan["history"]:
        host.noop("no release has passed the serving gate here yet: nothing is pruned")
        return
    if not (plan["paths"] or plan["images"] or not plan["recorded"]):
        host.noop(f"only the newest {kept} release(s) and the one asked for are on disk")
        return
    yield StringCommand("python3", pruner, QuoteString(model_dir), "--layout", layout, "--history",
                        QuoteString(history), "--kept", str(kept), "--keep", QuoteString(keep), "--image",
                        QuoteString(image), ">", "/dev/null")


@deploy("Inference service")
def inference_service():
    cfg: NodeConfig = node_config()
    cluster = node_cluster()
    head, nodes = cluster.head, cluster.size
    unit_text = render_container(cfg, head, nodes, cluster.members)
    unit_path = f"{UNIT_DIR}/{cfg.container_name}.container"
    env_path = service_env_path(cfg)
    batch = (ROCE_HELPER, ROCE_GID, ARGS_CHECK, JOB_PROBE, unit_path, env_path)  # read in one round trip
    service = f"{cfg.container_name}.service"
    started = started_from_path(cfg)
    volume_dirs = [p for p in (cfg.jit_cache_dir, cfg.container_tmp_dir) if p]
    expect([(ManagedFiles, {"paths": batch}), *[(Directory, {"path": p}) for p in volume_dirs],
            (Sha256File, {"path": unit_path}), *follow_up_reads(QUADLET_STAMP), (SystemdStatus, {"services": [service]}),
            (ServiceStartedFrom, {"record": started, "stamp": STAMP}),
            *([(GatePassed, {"record": gate_record_path(cfg), "service": service})] if cfg.is_head else []),
            *([(ExistingPaths, {"paths": (closed_flag_path(cfg),)})] if cfg.is_head and cfg.endpoint_enabled else []),
            (ReleasesOnDisk, prune_reads(cfg))])
    atomic_put(batch=batch, name="Install the RoCE GID lookup", src=helper_path("inference_service/roce_gid.py"),
              dest=ROCE_HELPER, user="root", group="root", mode="0755", create_remote_dir=True)
    atomic_put(batch=batch, name="Install its start-time wrapper",
              src=StringIO(f"#!/bin/sh\nexec python3 {ROCE_HELPER} \"$@\" --sysfs {cfg.roce_sysfs_root}\n"),
              dest=ROCE_GID, user="root", group="root", mode="0755")
    atomic_put(batch=batch, name="Install the vLLM command-line check", src=helper_path("inference_service/check_vllm_args.py"),
              dest=ARGS_CHECK, user="root", group="root", mode="0644", create_remote_dir=True)
    atomic_put(batch=batch, name="Install the multi-node job probe", src=helper_path("inference_service/job_probe.py"),
              dest=JOB_PROBE, user="root", group="root", mode="0644", create_remote_dir=True)
    for path in volume_dirs:
        directory_present(name="Create the persistent JIT cache and tmp directories", path=path,
                        user="root", group="root", mode="0755")
    check = args_check_command(cfg, vllm_argv(cfg, head, nodes)) if cfg.vllm_launch == "cli" else None
    vllm_accepts(name="Check the new command line with the image's own vLLM", unit_path=unit_path,
                 unit_text=unit_text, check=check)
    members = cluster_member_names()
    cluster_changes_whole(name="Change a multi-node cluster only as a whole", unit_path=unit_path, unit_text=unit_text,
                          cluster=cfg.cluster_name, members=members)
    secret_file(batch=batch, name="Write the service environment (0600, never printed)",
                src=StringIO(render_service_env(cfg, head, nodes)), dest=env_path, private_dir=False)
    atomic_put(batch=batch, name="Install the Quadlet unit", src=StringIO(unit_text), dest=unit_path,
               user="root", group="root", mode="0644", create_remote_dir=True, resets=follow_up_stamp(QUADLET_STAMP))
    follow_up_done(name="Run the Quadlet generator (daemon-reload)", stamp=QUADLET_STAMP,
                   command="systemctl daemon-reload", paths=(unit_path,), contents=(unit_text,))
    fp = fingerprint(unit_text, cfg, head, nodes)
    record = gate_record_path(cfg)
    if cfg.is_head and cfg.endpoint_enabled:
        endpoint_closed_for_the_switch(name="Close the endpoint to new requests before a restart", service=service,
                                       started_from=started, fingerprint=fp, flag=closed_flag_path(cfg))
    service_current(name="Start or update workers (rank > 0) before heads", service=service, started_from=started,
                    fingerprint=fp, record=record, act=not cfg.is_head)
    service_current(name="Start or update heads and single nodes", service=service, started_from=started,
                    fingerprint=fp, record=record, act=cfg.is_head)
    service_serving(name="Wait until it serves (heads: /health and the serving gate)", service=service,
                    started_from=started, fingerprint=fp, release=release_of(cfg, fp), record=record,
                    head=cfg.is_head, workers=tuple(members[1:]) if cfg.is_head else (),
                    model=served_model_name(cfg))
    releases_pruned(name=f"Prune releases beyond the newest {cfg.releases_kept} (model commits, images)",
                    **prune_reads(cfg))

"""Preflight: read-only facts per host, one table per run, and a stop for every cluster with an unfit member
before anything changes on it (the other clusters go on: one sick node does not stop the lab).

Refuses what the profile cannot run on: a wrong CPU architecture, too little free disk for the part of
the model still missing, a /dev/shm too small for the KV offload, a GPU index the inventory names that
nvidia-smi does not list, a fabric address the node does not have, a container device it lacks, a
preinstalled driver whose modules package and userspace differ. A reboot-required driver is shown, not
refused: the driver component handles it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.facts.server import OsRelease

from deploys.apt_sources import sources_args
from deploys.service.release import failed_release_path
from deploys.run.reads import expect, operation, read
from deploys.host_tuning import host_shm_problem
from deploys.inventory import cluster_member_names, is_inference_node, node_config
from deploys.ops import fail_host
from deploys.model.snapshot import MANIFEST, model_files, resources_args, unchanged_bytes
from deploys.monitoring.host import planned_reads as monitoring_planned_reads
from deploys.nvidia_driver import packages_differ_message
from deploys.run.state import kept
from deploys.schema import NodeConfig
from facts.apt import AptSourcesNaming
from facts.containers import JsonRecord, PodmanVersion
from facts.host import ExistingPaths, InterfaceAddresses, ManagedFiles, MountSizeBytes, NodeResources, NodeResourcesDict
from facts.nvidia import (KernelPackages, NvidiaDriverPackages, NvidiaKernelModule, NvidiaSmiGpus, SecureBoot,
                          driver_state)

ARCH_ALIASES = {"arm64": "aarch64", "amd64": "x86_64"}
COLUMNS = ("host", "cluster/rank", "OS", "arch", "kernel", "CPUs", "RAM", "free disk (model path)",
           "/dev/shm", "GPUs", "driver", "Podman", "RDMA")


@dataclass
class _Run:
    rows: dict[str, list[str]] = field(default_factory=dict)
    problems: dict[str, list[str]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def fabric_problem(cfg: NodeConfig, addresses: list[str]) -> str | None:
    """The fabric address must be one this node really has (a loopback one, on a machine shared by the
    whole cluster, may lie anywhere in lo's network). Unknown (no iproute2) is not refused."""
    if cfg.fabric_address is None or not addresses:
        return None
    want = ipaddress.ip_address(cfg.fabric_address.split("%", 1)[0])
    for cidr in addresses:
        iface = ipaddress.ip_interface(cidr.split("%", 1)[0])
        if iface.ip == want or (cfg.fabric_on_one_host and iface.ip.is_loopback and want in iface.network):
            return None
    return (f"fabric_address {cfg.fabric_address} is not an address of this node (it has "
            f"{', '.join(a.split('/')[0] for a in addresses)}): the other ranks could not reach it")


def own_address_problems(cfg: NodeConfig, addresses: list[str]) -> list[str]:
    """The endpoint (on the head) and node exporter listen on addresses this node has (any of lo's network for a
    loopback one). Unknown (no iproute2) is not refused."""
    wanted = []
    if cfg.endpoint_enabled and cfg.is_head:
        wanted.append(("endpoint_address", cfg.endpoint_address, "the endpoint"))
    if cfg.monitoring_enabled and cfg.node_exporter_address is not None:
        wanted.append(("node_exporter_address", cfg.node_exporter_address, "node exporter"))
    if not addresses:
        return []
    out = []
    for key, address, what in wanted:
        want = ipaddress.ip_address(address)
        if not any(iface.ip == want or (iface.ip.is_loopback and want in iface.network)
                   for iface in (ipaddress.ip_interface(cidr.split("%", 1)[0]) for cidr in addresses)):
            out.append(f"{key} {address} is not an address of this node (it has "
                       f"{', '.join(a.split('/')[0] for a in addresses)}): {what} could not listen there")
    return out


def problems_for(cfg: NodeConfig, res: NodeResourcesDict, shm_bytes: int, smi: dict | None = None,
                 addresses: list[str] | None = None, devices: list[str] | None = None, unchanged: int = 0) -> list[str]:
    """What stops this host from running its profile (empty when it can). ``devices``: which of
    ``cfg.container_devices`` exist on the node. ``unchanged``: bytes of the asked commit a `plain` directory holding
    another commit already has (``unchanged_bytes``: linked or kept, not fetched)."""
    out = []
    missing_devices = [d for d in cfg.container_devices if d not in (devices or [])]
    if missing_devices:
        out.append(f"container_devices {', '.join(missing_devices)} not on this node (no RDMA NIC, or its driver "
                   f"is not loaded; RDMA devices seen: {', '.join(res.get('rdma') or []) or 'none'}): the "
                   "container could not start")
    if problem := fabric_problem(cfg, addresses or []):
        out.append(problem)
    out += own_address_problems(cfg, addresses or [])
    gpus = (smi or {}).get("gpus") or []
    if (smi or {}).get("hung"):
        out.append(smi["error"])
    if gpus:  # only checkable once a driver answers; the driver component installs one otherwise
        present = {g["index"] for g in gpus}
        missing = [i for i in cfg.gpu_indices if i not in present]
        if missing:
            out.append(
                f"GPU index {', '.join(map(str, missing))} not present (gpu_indices {cfg.gpu_indices}; "
                f"nvidia-smi lists {sorted(present)})"
            )
    arch = ARCH_ALIASES.get(res["arch"], res["arch"])
    if arch != cfg.node_arch:
        out.append(f"arch is {res['arch']}, the profile needs {cfg.node_arch} (node_arch)")
    held = res.get("model_held_commit")
    need = max(0, int(cfg.model_size_gb * 1e9) - res["model_present_bytes"] - (unchanged if held else 0))
    if res["disk_free_bytes"] < need:
        beside = (f"; the directory holds commit {held[:12]}, kept beside the new one for a rollback until the new "
                  f"release passed the serving gate ({unchanged} bytes of it unchanged, not fetched again)"
                  if held else "")
        out.append(
            f"too little disk for the model at {cfg.model_root}: {res['disk_free_bytes']} bytes free at "
            f"{res['disk_path']}, {need} bytes still needed for commit {cfg.model_revision[:12]} (model_size_gb "
            f"{cfg.model_size_gb:g}{beside})"
        )
    shm = host_shm_problem(cfg, shm_bytes)
    if shm:
        out.append(shm)
    return out


NVSWITCH = "/dev/nvidia-nvswitchctl"


def driver_problems(cfg: NodeConfig, state: dict, secure_boot: dict | None = None, nvswitch: bool = False) -> list[str]:
    """A preinstalled driver whose packages differ is refused here: the driver deploy installs nothing that
    could fix it (other sources may: the driver deploy checks again after installing). So is a driver about to be
    built by DKMS under Secure Boot with its signing key not enrolled (the module would not load after the
    reboot), and an NVSwitch host (HGX: nvidia-fabricmanager, matched to the driver, which this toolkit does not
    manage, must run before CUDA sees the GPUs)."""
    out = []
    if cfg.nvidia_driver_source == "preinstalled" and state["state"] == "packages_differ":
        out.append(packages_differ_message(state["reason"]))
    sb = secure_boot or {}
    if (sb.get("enabled") and cfg.nvidia_driver_source != "preinstalled" and state["state"] != "ok"
            and not sb.get("mok_enrolled")):
        out.append("Secure Boot is on and the driver is about to be built by DKMS, whose signing key (MOK) is not "
                   "enrolled: the module would not load after the reboot. Enroll it (`mokutil --import "
                   "/var/lib/shim-signed/mok/MOK.der`, then confirm at the console on the next boot), or install "
                   "signed modules and use nvidia_driver_source: preinstalled")
    if nvswitch:
        out.append(f"an NVSwitch host ({NVSWITCH}): nvidia-fabricmanager, matched to the driver, must run before CUDA "
                   "sees the GPUs, and this toolkit does not manage it")
    return out


def gpu_column(smi: dict, mem_bytes: int) -> str:
    """'2x NVIDIA H200 140.4 GiB cc9.0'; unified memory ([N/A], GB10) shows the host's RAM instead."""
    gpus = smi.get("gpus") or []
    if not gpus:
        return f"({smi['error'][:40]})" if smi.get("error") else "-"
    kinds: dict[str, int] = {}
    for g in gpus:
        memory = f"{g['memory_mib'] / 1024:.1f} GiB" if g["memory_mib"] is not None else f"unified {_gib(mem_bytes)}"
        label = f"{g['name']} {memory} cc{g['compute_cap'] or '?'}"
        kinds[label] = kinds.get(label, 0) + 1
    return ", ".join(f"{n}x {label}" for label, n in kinds.items())


def driver_column(state: dict) -> str:
    if state["state"] == "not_installed":
        return "-"
    text = f"{state['loaded'] or state['installed']} {state['flavour'] or ''}".strip()
    if state["state"] == "packages_differ":
        return f"{text} (PACKAGES DIFFER: {state['reason']})"
    return text if state["state"] in ("ok", "module_only") else f"{text} (REBOOT REQUIRED: {state['reason']})"


def row_for(name: str, cfg: NodeConfig, res: NodeResourcesDict, shm_bytes: int, smi: dict | None = None,
            state: dict | None = None, podman: str | None = None) -> list[str]:
    return [
        name, f"{cfg.cluster_name}/{cfg.node_rank}",
        res.get("os", "?") + (f" (DGX OS {res['dgx_os']})" if res.get("dgx_os") else ""), res["arch"], res.get("kernel", "?"),
        str(res["cpus"]), _gib(res["mem_bytes"]), f"{_gib(res['disk_free_bytes'])} ({res['disk_path']})",
        _gib(shm_bytes), gpu_column(smi or {}, res["mem_bytes"]), driver_column(state or {"state": "not_installed"}),
        podman or "-", ",".join(res["rdma"]) or "-",
    ]


def format_table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [list(COLUMNS), *rows]) for i in range(len(COLUMNS))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(list(COLUMNS)), fmt(["-" * w for w in widths]), *map(fmt, rows)])


@deploy("Preflight")
def preflight():
    """Facts only. The last host to report prints the table; a host that cannot run fails its cluster."""
    cfg = node_config()
    module = {"root": cfg.nvidia_module_root}
    resources = resources_args(cfg)
    expect([(NodeResources, resources),
            (MountSizeBytes, {"path": "/dev/shm"}), (NvidiaSmiGpus, {}), (NvidiaDriverPackages, {}),
            (NvidiaKernelModule, module), (KernelPackages, {}), (InterfaceAddresses, {}),
            (ExistingPaths, {"paths": tuple(cfg.container_devices)}), (ExistingPaths, {"paths": (NVSWITCH,)}),
            (SecureBoot, {}), (PodmanVersion, {}),
            (OsRelease, {}),  # the driver deploy reads it while preparing (its repo path): no round trip of its own
            (JsonRecord, {"path": failed_release_path(cfg)}),  # the next step's (deploys/failed_release.py) likewise
            *([(JsonRecord, {"path": MANIFEST})] if cfg.model_layout == "plain" else []),  # what a `plain` upgrade
            # need not fetch: the live commit's files (`hf_cache` stages a snapshot of its own: unchanged_bytes is 0)
            (ManagedFiles, {"paths": model_files(cfg)}),  # the model step's, read while it plans (model_state)
            *monitoring_planned_reads(host.inventory, host.name),  # the monitoring host's step's likewise
            (AptSourcesNaming, sources_args(cfg))])
    res = read(host, NodeResources, **resources)
    shm_bytes = read(host, MountSizeBytes, path="/dev/shm")
    smi = read(host, NvidiaSmiGpus)
    state = driver_state(read(host, NvidiaDriverPackages), read(host, NvidiaKernelModule, root=cfg.nvidia_module_root),
                         read(host, KernelPackages))

    addresses = read(host, InterfaceAddresses)
    devices = read(host, ExistingPaths, paths=tuple(cfg.container_devices))
    nvswitch = bool(read(host, ExistingPaths, paths=(NVSWITCH,)))
    secure_boot = read(host, SecureBoot)
    podman = read(host, PodmanVersion)
    foreign = read(host, AptSourcesNaming, **sources_args(cfg))
    unchanged = unchanged_bytes(cfg, read(host, JsonRecord, path=MANIFEST)) if res.get("model_held_commit") else 0

    # every fact is read above: a fact read yields to the other hosts, which must not see this host's row
    # before its problems
    run = kept(host.state, "preflight", _Run)
    run.rows[host.name] = row_for(host.name, cfg, res, shm_bytes, smi, state, podman)
    if foreign["entries"]:
        run.notes[host.name] = (f"apt entries for the NVIDIA repos beside the toolkit's own (a second Signed-By for "
                                f"one URI breaks apt), disabled by this run, entry by entry: "
                                f"{', '.join(foreign['entries'])}")
    run.problems[host.name] = (problems_for(cfg, res, shm_bytes, smi, addresses, devices, unchanged)
                               + driver_problems(cfg, state, secure_boot, nvswitch))
    cluster_fits(name="Preflight: every member of this cluster can run it", cluster=cfg.cluster_name,
                 members=cluster_member_names())
    active = [h.name for h in host.state.inventory.get_active_hosts() if is_inference_node(h)]
    if not set(active) <= set(run.rows):
        return
    logger.info("Preflight:\n" + format_table([run.rows[n] for n in sorted(active)])
                + "".join(f"\n  - host {n}: {run.notes[n]}" for n in sorted(active) if n in run.notes))
    bad = {n: p for n, p in sorted(run.problems.items()) if p and n in active}
    if bad:
        lines = "\n".join(f"  - host {n}: {msg}" for n, msgs in bad.items() for msg in msgs)
        logger.error(f"preflight failed; nothing will change on these hosts' clusters (the others go on):\n{lines}")


@operation()
def cluster_fits(cluster: str, members: list[str]):
    """A cluster runs only when every member in this run passed preflight: an unfit member fails its whole
    cluster here, the first step, before anything changes on any member; the other clusters go on. (Decided
    when the run executes: every host's preflight has reported by then.)

    + cluster: the cluster's name
    + members: the host names of every member
    """
    run = kept(host.state, "preflight", _Run)
    bad = {m: run.problems[m] for m in members if run.problems.get(m)}
    if not bad:
        host.noop(f"every member of cluster {cluster} in this run can run it")
        return
    lines = "\n".join(f"  - host {n}: {msg}" for n, msgs in bad.items() for msg in msgs)
    yield fail_host(f"{host.name}: preflight failed for cluster {cluster}; nothing was changed on its members:\n{lines}")

"""NVIDIA driver: install the 580 branch from one source, hold it three ways, and prove the loaded
kernel module is the installed driver (or reboot / stop the host, by inventory choice).

Held three ways because each alone has failed someone: NVIDIA's branch pinning package (from 590 on the
driver packages drop the branch from their names), an apt preferences file that gives the branch 1001
and every other driver branch -1, and `apt-mark hold` on the installed set. Unattended upgrades are
told to leave NVIDIA/CUDA driver packages alone (the GB10 write-up's 590 broke unified memory).
"""

from __future__ import annotations

from io import StringIO

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, QuoteString, StringCommand, deploy
from pyinfra.facts.files import File
from pyinfra.facts.server import OsRelease
from pyinfra.operations import server

from deploys.apt_sources import CUDA_SOURCE, cuda_repo_path, cuda_repo_uri
from deploys.apt_state import APT_READS, apt_lists_updated
from deploys.run.reads import expect, operation, read
from deploys.inventory import node_config
from deploys.model.snapshot import resources_args
from deploys.ops import (
    file_absent,
    packages_installed,
    apt_held,
    atomic_put,
    fail_host,
    flat_repo_source,
    follow_up_done,
    follow_up_reads,
    follow_up_stamp,
    keyring_verified,
    lock_waiting,
)
from deploys.schema import NodeConfig, NvidiaDriverKeys
from facts.apt import AptHolds, KeyringFingerprints
from facts.host import ManagedFiles, NodeResources
from facts.nvidia import (
    DRIVER_VERSION,
    DriverStateDict,
    KernelPackages,
    NvidiaDriverPackages,
    NvidiaKernelModule,
    driver_state,
    kernel_hold_set,
)


PIN_FILE = "/etc/apt/preferences.d/90-inference-nodes-nvidia-driver"
UNATTENDED_FILE = "/etc/apt/apt.conf.d/51inference-nodes-nvidia-driver"
KEYRING = "/etc/apt/keyrings/inference-nodes-nvidia-cuda.gpg"
NOUVEAU_FILE = "/etc/modprobe.d/blacklist-nouveau.conf"
HEADER = "# Managed by inference-nodes (deploys/nvidia_driver.py); local edits are overwritten.\n"
NOUVEAU_TEXT = f"{HEADER}blacklist nouveau\noptions nouveau modeset=0\n"
INITRAMFS_STAMP = "nvidia-driver-initramfs"  # follow-up stamps (deploys/ops.py follow_up_done)
LISTS_STAMP = "nvidia-driver-apt-lists"


def packages_differ_message(reason: str) -> str:
    """Why a host with the ``packages_differ`` driver state is stopped (the driver deploy and preflight)."""
    return (f"DRIVER PACKAGES DIFFER ({reason}). The running kernel's NVIDIA modules package, the "
            "userspace driver and the loaded module must be one driver version, else the next boot gives an NVRM "
            "API mismatch; a reboot cannot fix it. Install the matching modules package or userspace driver (one "
            "release's set), or roll the upgrade back, and rerun")


DRIVER_GLOBS = "nvidia-* libnvidia-* cuda-drivers* xserver-xorg-video-nvidia*"


def render_apt_pin(branch: str) -> str:
    """First matching record wins per version: the branch at 1001, any other driver branch never.

    Other-branch versions are recognised by a three-digit major (590.44.01-1); the container toolkit
    (nvidia-container-toolkit 1.x, libnvidia-container1 1.x) shares the name prefixes and is untouched.
    """
    return (
        f"{HEADER}"
        f"Package: {DRIVER_GLOBS}\nPin: version {branch}.*\nPin-Priority: 1001\n\n"
        f"Package: {DRIVER_GLOBS}\nPin: version /^([0-9]+:)?[0-9][0-9][0-9][.]/\nPin-Priority: -1\n"
    )


def render_unattended_blacklist(cfg: NvidiaDriverKeys) -> str:
    patterns = ["nvidia-", "libnvidia-", "cuda-drivers"]
    if cfg.nvidia_kernel_hold:
        patterns.append("linux-")
    body = "".join(f'    "{p}";\n' for p in patterns)
    return f"{HEADER}Unattended-Upgrade::Package-Blacklist {{\n{body}}};\n"


def render_cuda_source(cfg: NvidiaDriverKeys, repo_path: str) -> str:
    return flat_repo_source(HEADER, cuda_repo_uri(cfg.nvidia_repo_url, repo_path), KEYRING)


def other_branch_packages(packages: dict, branch: str) -> dict[str, str]:
    """Installed driver packages of another branch (name -> version)."""
    out = {}
    for name, version in packages.get("installed", {}).items():
        m = DRIVER_VERSION.match(version)
        if m and m["branch"] != branch:
            out[name] = version
    return out


@operation()
def branch_allowed(branch: str, allow_change: bool):
    """Refuse a host whose installed or loaded driver is another branch, unless ``allow_change``.

    + branch: the branch the inventory asks for
    + allow_change: move the host instead of refusing it
    """
    cfg = node_config()
    packages = read(host, NvidiaDriverPackages)
    module = read(host, NvidiaKernelModule, root=cfg.nvidia_module_root)
    others = other_branch_packages(packages, branch)
    found = [f"{n} {v}" for n, v in sorted(others.items())]
    loaded = module.get("version")
    if loaded and not loaded.startswith(f"{branch}."):
        found.append(f"loaded kernel module {loaded}")
    if not found:
        host.noop(f"no driver branch other than {branch} on the host")
        return
    if not allow_change:
        yield fail_host(
            f"{host.name} runs another driver branch ({', '.join(found)}); the inventory asks for {branch}. "
            "Set allow_driver_change: true to move it (a reboot follows), or fix nvidia_driver_branch."
        )
        return
    if cfg.nvidia_driver_source == "preinstalled":
        yield fail_host(
            f"{host.name}: the preinstalled driver is another branch ({', '.join(found)}); source preinstalled "
            f"installs nothing, so it cannot move it to {branch}"
        )
        return
    logger.warning(f"{host.name}: moving from {', '.join(found)} to branch {branch} (allow_driver_change)")
    held = sorted(n for n in others if n in packages.get("held", []))
    if held:
        yield lock_waiting("apt-mark", "unhold", *held)
    # Packages named after the old branch (nvidia-driver-pinning-590) go; the rest is downgraded by the pin.
    named = sorted(n for n, v in others.items() if n.endswith(f"-{DRIVER_VERSION.match(v)['branch']}"))
    if named:
        yield StringCommand("DEBIAN_FRONTEND=noninteractive", "apt-get", "remove", "-y", *map(QuoteString, named))


@operation()
def driver_installed(packages: list[str], branch: str):
    """Install ``packages`` so that every driver package is on ``branch`` (the pin picks the versions).

    + packages: package names to install (no versions)
    + branch: the driver branch every installed driver package must be on
    """
    facts = read(host, NvidiaDriverPackages)
    installed = facts.get("installed", {})
    missing = [p for p in packages if p not in installed]
    off_branch = sorted(other_branch_packages(facts, branch))
    if not missing and not off_branch:
        host.noop(f"{', '.join(packages)} installed on branch {branch}")
        return
    wanted = sorted(set(packages) | set(off_branch))
    # fresh lists first: an interrupted earlier run may have added the source without updating them
    yield lock_waiting("apt-get", "update", "-qq")
    yield StringCommand(
        "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "--allow-downgrades",
        "-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold", *map(QuoteString, wanted),
    )


@operation()
def driver_held(kernel: str | None = None):
    """`apt-mark hold` every installed driver package and, with ``kernel``, what keeps that kernel in place:
    its image/modules/headers, NVIDIA's precompiled modules package for it, and the flavour metapackages
    that would bring the next kernel (facts/nvidia.py ``kernel_hold_set``).

    + kernel: a kernel release, or ``running`` for the one the node runs (`uname -r`)
    """
    facts = read(host, NvidiaDriverPackages)
    wanted = sorted(facts.get("installed", {}))
    if kernel:
        packages = read(host, KernelPackages)
        release = packages.get("running") if kernel == "running" else kernel
        kernel_pkgs = kernel_hold_set(packages, release or "")
        if not kernel_pkgs:
            yield fail_host(f"{host.name}: nvidia_kernel_hold {kernel}: no linux-image-{release} installed")
            return
        wanted += kernel_pkgs
    yield from apt_held._inner(packages=wanted)


def current_driver_state(node, root: str) -> DriverStateDict:
    """driver_state from the node's facts (userspace packages, loaded module, the kernel's modules package)."""
    return driver_state(read(node, NvidiaDriverPackages), read(node, NvidiaKernelModule, root=root),
                        read(node, KernelPackages))


def _recheck_after_reboot(state, host, root: str):
    result = current_driver_state(host, root)
    if result["state"] != "ok":
        host.log_styled(f"still not usable after the reboot: {result['reason']}", fg="red", log_func=logger.error)
        return False
    host.log_styled(f"driver usable after the reboot: {result['reason']}", fg="green", log_func=logger.info)
    return True


@operation()
def driver_loaded(root: str, allow_reboot: bool, reboot_delay: int = 10):
    """The loaded kernel module must be the installed userspace driver, and the running kernel's NVIDIA modules
    package (where there is one) the same driver; else reboot (module only) or stop the host.

    + root: where sys/ and proc/ are read
    + allow_reboot: reboot (then wait and re-check) instead of failing the host
    + reboot_delay: seconds before reconnecting after the reboot
    """
    result = current_driver_state(host, root)
    if result["state"] in ("ok", "module_only"):
        host.noop(f"driver usable: {result['reason']}")
        return
    if result["state"] == "not_installed":
        yield fail_host(f"{host.name}: no NVIDIA driver is installed or loaded")
        return
    if result["state"] == "packages_differ":
        yield fail_host(f"{host.name}: {packages_differ_message(result['reason'])}")
        return
    if not allow_reboot or host.name == "@local":
        why = "refusing to reboot the machine pyinfra runs on" if host.name == "@local" else "allow_reboot is false"
        yield fail_host(
            f"{host.name}: REBOOT REQUIRED ({result['reason']}; {why}). Stopped before anything that needs "
            "the GPU: reboot it and rerun"
        )
        return
    logger.warning(f"{host.name}: REBOOT REQUIRED ({result['reason']}); rebooting (allow_reboot)")
    yield from server.reboot._inner(delay=reboot_delay, interval=1, reboot_timeout=600)
    yield FunctionCommand(_recheck_after_reboot, (root,), {})


@deploy("NVIDIA driver")
def nvidia_driver():
    cfg: NodeConfig = node_config()
    batch = (PIN_FILE, UNATTENDED_FILE, CUDA_SOURCE, NOUVEAU_FILE)  # read in one round trip
    branch = cfg.nvidia_driver_branch
    module = {"root": cfg.nvidia_module_root}
    expect([(ManagedFiles, {"paths": batch}), *APT_READS, (KeyringFingerprints, {"path": KEYRING}), (OsRelease, {}),
            (File, {"path": CUDA_SOURCE}), (File, {"path": KEYRING}), *follow_up_reads(INITRAMFS_STAMP, LISTS_STAMP),
            (NvidiaDriverPackages, {}), (NvidiaKernelModule, module), (KernelPackages, {}), (AptHolds, {})])
    branch_allowed(
        name=f"Refuse a host on another driver branch than {branch}",
        branch=branch,
        allow_change=cfg.allow_driver_change,
    )
    atomic_put(
        batch=batch,
        name=f"Pin driver packages to branch {branch}, refuse other branches",
        src=StringIO(render_apt_pin(branch)),
        dest=PIN_FILE,
        user="root", group="root", mode="0644",
        resets=follow_up_stamp(LISTS_STAMP) if cfg.nvidia_driver_source != "preinstalled" else None,
    )
    atomic_put(
        batch=batch,
        name="Keep unattended upgrades off the driver",
        src=StringIO(render_unattended_blacklist(cfg)),
        dest=UNATTENDED_FILE,
        user="root", group="root", mode="0644",
    )
    if cfg.nvidia_driver_source != "cuda_repo":  # a node that once installed from it: apt must not keep it
        file_absent(name="Remove NVIDIA's CUDA repo source (the driver does not come from it)", path=CUDA_SOURCE)
        file_absent(name="Remove NVIDIA's CUDA repo key", path=KEYRING)
    if cfg.nvidia_driver_source != "preinstalled":
        repo_files = [(PIN_FILE, render_apt_pin(branch))]  # what apt's lists are fetched for
        if cfg.nvidia_driver_source == "cuda_repo":
            apt_lists_updated(name="Update apt lists when older than a day (waits for a held lock)", cache_time=86400)
            packages_installed(
                name="Install what fetching and checking the repo key needs",
                packages=["curl", "gpg", "ca-certificates"],
            )
            keyring_verified(
                name="Install NVIDIA's repo key (fingerprint checked)",
                url=cfg.nvidia_repo_key_url,
                fingerprint=cfg.nvidia_repo_key_fingerprint,
                dest=KEYRING,
                resets=follow_up_stamp(LISTS_STAMP),
            )
            repo_path = cuda_repo_path(read(host, OsRelease), cfg.node_arch)  # preflight checked the arch
            source = render_cuda_source(cfg, repo_path)
            atomic_put(
                batch=batch,
                name=f"Add NVIDIA's CUDA repo ({repo_path})",
                src=StringIO(source),
                dest=CUDA_SOURCE,
                user="root", group="root", mode="0644",
                resets=follow_up_stamp(LISTS_STAMP),
            )
            repo_files.append((CUDA_SOURCE, source))
        atomic_put(
            batch=batch,
            name="Blacklist nouveau",
            src=StringIO(NOUVEAU_TEXT),
            dest=NOUVEAU_FILE,
            user="root", group="root", mode="0644",
            resets=follow_up_stamp(INITRAMFS_STAMP),
        )
        follow_up_done(
            name="Rebuild the initramfs without nouveau",
            stamp=INITRAMFS_STAMP,
            command="if command -v update-initramfs >/dev/null; then update-initramfs -u; fi",
            paths=(NOUVEAU_FILE,),
            contents=(NOUVEAU_TEXT,),
        )
        follow_up_done(
            name="Update apt lists after a source or pin change",
            stamp=LISTS_STAMP,
            command=lock_waiting("apt-get", "update", "-qq"),
            paths=tuple(p for p, _ in repo_files),
            contents=tuple(c for _, c in repo_files),
        )
        if cfg.nvidia_kernel_headers:
            kernel = read(host, NodeResources, **resources_args(cfg)).get("kernel")  # preflight's read
            packages_installed(name="Install the running kernel's headers (DKMS builds the driver module against them)",
                         packages=[f"linux-headers-{kernel}"])
        driver_installed(
            name=f"Install driver branch {branch}: {', '.join(cfg.driver_packages)}",
            packages=cfg.driver_packages,
            branch=branch,
        )
    hold = cfg.nvidia_kernel_hold
    driver_held(name="Hold the installed driver packages" + (f" and the {hold} kernel" if hold else ""), kernel=hold)
    driver_loaded(
        name="Check the loaded kernel module is the installed driver",
        root=cfg.nvidia_module_root,
        allow_reboot=cfg.allow_reboot,
    )

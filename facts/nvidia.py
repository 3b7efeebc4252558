"""Facts about the NVIDIA driver: installed packages and holds, the loaded kernel module, nvidia-smi's GPUs.

Every fact here succeeds on a host without a driver (empty values), and a parse failure is a
FactProcessError, which fails that host alone. ``driver_state`` combines them into the one answer the
deploy and the audit need: is the loaded module the installed userspace driver?
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Literal, TypedDict

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError
from facts.apt import held_packages

# Driver packages: their versions start with the branch (580.95.05-1, 580.95.05-0ubuntu0.24.04.2).
# Toolkit packages share the prefixes (nvidia-container-toolkit, libnvidia-container1) but are 1.x.
DRIVER_PACKAGE = re.compile(r"^(nvidia-|libnvidia-|cuda-drivers|xserver-xorg-video-nvidia)")
# NVIDIA's precompiled, signed modules for one kernel (linux-modules-nvidia-580-open-6.17.0-1008-nvidia), not
# the flavour metapackage (linux-modules-nvidia-580-open-nvidia-hwe-24.04): its kernel part starts with a digit.
MODULES_PACKAGE = re.compile(r"^linux-modules-nvidia-(?P<branch>\d{3})(?:-server)?(?:-open)?-(?P<kernel>\d.*)$")
# The driver such a package was built for: Ubuntu pins it as `nvidia-kernel-common-580 (>= 580.95.05)` (+ `<=`).
_KERNEL_COMMON = re.compile(r"^nvidia-kernel-common-\d{3}\s*\(>=\s*(?P<version>[^)\s]+)\s*\)")
DRIVER_VERSION = re.compile(r"^(?:\d+:)?(?P<branch>\d{3})\.(?P<rest>[\d.]+)")
USERSPACE_PACKAGES = ("libnvidia-compute", "nvidia-utils", "nvidia-driver", "nvidia-open", "cuda-drivers")
_MARK = "##inference-nodes:"


def upstream_version(deb_version: str) -> str | None:
    """'580.95.05-0ubuntu1' -> '580.95.05'; None when the version is not a driver's."""
    m = DRIVER_VERSION.match(deb_version)
    return f"{m['branch']}.{m['rest'].rstrip('.')}" if m else None


class NvidiaDriverPackages(FactBase[dict]):
    """Installed driver packages (name -> Debian version) and every apt hold (kernel packages: KernelPackages).

    .. code:: python

        {"installed": {"libnvidia-compute-580": "580.95.05-0ubuntu1", "nvidia-open": "580.95.05-1"},
         "held": ["libnvidia-compute-580", "nvidia-open"]}
    """

    default = dict

    def requires_command(self) -> str:
        return "dpkg-query"

    def command(self) -> str:
        return (
            "dpkg-query -W -f='${db:Status-Abbrev}|${Package}|${Version}\\n' 2>/dev/null || true; "
            f"echo '{_MARK}holds'; apt-mark showhold 2>/dev/null || true"
        )

    def process(self, output: list[str]) -> dict[str, Any]:
        installed: dict[str, str] = {}
        held: list[str] = []
        in_holds = False
        for line in output:
            if line.strip() == f"{_MARK}holds":
                in_holds = True
            elif in_holds:
                held.append(line)
            else:
                parts = line.split("|")
                if len(parts) != 3:
                    raise FactProcessError(f"NvidiaDriverPackages: unexpected dpkg-query line {line!r}")
                status, name, version = (p.strip() for p in parts)
                name = name.split(":")[0]
                if status[1:2] != "i":  # second letter: installed ("ii", or "hi" when held)
                    continue
                if DRIVER_PACKAGE.match(name) and upstream_version(version):
                    installed[name] = version
        return {"installed": installed, "held": held_packages(held)}


def _depends(field: str) -> tuple[list[str], str | None]:
    """Package names in a Depends field (every alternative) and the driver an NVIDIA modules package pins."""
    names, driver = [], None
    for group in field.split(","):
        for alt in group.split("|"):
            alt = alt.strip()
            if not alt:
                continue
            names.append(alt.split()[0].split("(")[0].split(":")[0])
            m = _KERNEL_COMMON.match(alt)
            if m and driver is None:
                driver = upstream_version(m["version"])
    return names, driver


class KernelPackages(FactBase[dict]):
    """The running kernel (`uname -r`) and every installed linux-* package: its version, the packages it
    depends on, and for an NVIDIA modules package the driver it was built for (else None).

    .. code:: python

        {"running": "6.17.0-1008-nvidia",
         "packages": {"linux-modules-nvidia-580-open-6.17.0-1008-nvidia": {
             "version": "6.17.0-1008.8", "depends": ["linux-image-6.17.0-1008-nvidia", "nvidia-kernel-common-580"],
             "driver": "580.95.05"}}}
    """

    default = dict

    def command(self) -> str:
        return (
            f"echo '{_MARK}running'; uname -r; echo '{_MARK}packages'; "
            "dpkg-query -W -f='${db:Status-Abbrev}\\t${Package}\\t${Version}\\t${Depends}\\n' 'linux-*' 2>/dev/null || true"
        )

    def process(self, output: list[str]) -> dict[str, Any]:
        running, packages, section = None, {}, None
        for line in output:
            if line.startswith(_MARK):
                section = line[len(_MARK):].strip()
            elif section == "running" and line.strip():
                running = line.strip()
            elif section == "packages" and line.strip():
                parts = line.split("\t")
                if parts[0].strip()[1:2] != "i":  # "un"/"rc": known to dpkg, not installed (empty fields)
                    continue
                if len(parts) < 3:
                    raise FactProcessError(f"KernelPackages: unexpected dpkg-query line {line!r}")
                name, version = parts[1].strip(), parts[2].strip()
                depends, driver = _depends(parts[3] if len(parts) > 3 else "")
                packages[name.split(":")[0]] = {"version": version, "depends": depends,
                                                "driver": driver if MODULES_PACKAGE.match(name) else None}
        return {"running": running, "packages": packages}


def kernel_hold_set(kernel: dict, release: str) -> list[str]:
    """What keeps kernel ``release`` in place: every installed linux-* package built for it (the name ends in
    `-<release>`: image, modules, extra, headers, NVIDIA's precompiled modules) and every linux-* package that
    depends on one of those, directly or through another (the flavour metapackages, whose upgrade brings the
    next kernel). Empty when no linux-image of ``release`` is installed."""
    packages = kernel.get("packages", {})
    held = {name for name in packages if name.endswith(f"-{release}")}
    if not any(name.startswith("linux-image-") for name in held):
        return []
    grew = True
    while grew:
        more = {name for name, p in packages.items() if name not in held and held & set(p["depends"])}
        held |= more
        grew = bool(more)
    return sorted(held)


def modules_for(kernel: dict, release: str | None) -> tuple[str, str] | None:
    """(package, driver version) of NVIDIA's precompiled modules package for kernel ``release``, if installed."""
    for name, p in sorted(kernel.get("packages", {}).items()):
        m = MODULES_PACKAGE.match(name)
        if m and m["kernel"] == release and p["driver"]:
            return name, p["driver"]
    return None


class NvidiaKernelModule(FactBase[dict]):
    """The loaded nvidia kernel module: version and flavour (open or proprietary), or not loaded.

    ``root`` is where ``sys/`` and ``proc/`` are read (``/`` on real hosts; the sandbox's stand-in
    module lives elsewhere). Reads /sys/module/nvidia/version and /proc/driver/nvidia/version.
    """

    default = dict

    def command(self, root: str = "/") -> str:
        base = root.rstrip("/")
        sys_v = shlex.quote(f"{base}/sys/module/nvidia/version")
        proc_v = shlex.quote(f"{base}/proc/driver/nvidia/version")
        return (
            f"echo '{_MARK}sys'; cat {sys_v} 2>/dev/null || true; "
            f"echo '{_MARK}proc'; cat {proc_v} 2>/dev/null || true"
        )

    def process(self, output: list[str]) -> dict[str, Any]:
        sections: dict[str, list[str]] = {"sys": [], "proc": []}
        current = None
        for line in output:
            if line.startswith(_MARK):
                current = line[len(_MARK):].strip()
                continue
            if current in sections and line.strip():
                sections[current].append(line.strip())
        nvrm = next((line for line in sections["proc"] if line.startswith("NVRM version:")), None)
        version = sections["sys"][0] if sections["sys"] else None
        if version is None and nvrm:
            m = re.search(r"\s(\d{3}\.\d+(?:\.\d+)?)\s", nvrm + " ")
            version = m.group(1) if m else None
        if version is not None and not DRIVER_VERSION.match(version):
            raise FactProcessError(f"NvidiaKernelModule: unexpected module version {version!r}")
        flavour = None
        if nvrm:
            flavour = "open" if "Open Kernel Module" in nvrm else "proprietary"
        return {"loaded": version is not None, "version": version, "flavour": flavour, "nvrm": nvrm}


_SMI_FIELDS = ("index", "name", "uuid", "memory.total", "compute_cap", "pci.bus_id", "driver_version")


SMI_TIMEOUT_S = 30  # nvidia-smi on a wedged GPU hangs for minutes, and every host's preflight waits behind it


class NvidiaSmiGpus(FactBase[dict]):
    """GPUs as nvidia-smi lists them, or the error it printed (e.g. a driver/library mismatch).

    memory_mib is None where nvidia-smi prints [N/A] (GB10's unified memory: use host memory).

    .. code:: python

        {"gpus": [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-…", "memory_mib": 143771,
                   "compute_cap": "9.0", "pci_bus_id": "00000000:18:00.0", "driver_version": "580.159.03"}],
         "error": None}
    """

    default = dict

    def requires_command(self) -> str:
        return "nvidia-smi"

    def command(self) -> str:
        query = ",".join(_SMI_FIELDS)
        return (
            f"out=$(timeout -k 5 {SMI_TIMEOUT_S} nvidia-smi --query-gpu={query} --format=csv,noheader,nounits 2>&1); rc=$?; "
            f"echo \"$out\"; echo '{_MARK}rc='$rc"
        )

    def process(self, output: list[str]) -> dict[str, Any]:
        rc_lines = [line for line in output if line.startswith(f"{_MARK}rc=")]
        if not rc_lines:
            raise FactProcessError(f"NvidiaSmiGpus: no exit status in {output!r}")
        rc = int(rc_lines[-1].split("=", 1)[1])
        lines = [line for line in output if line.strip() and not line.startswith(_MARK)]
        if rc in (124, 137):  # timeout's own statuses: it had to stop nvidia-smi
            return {"gpus": [], "error": f"nvidia-smi did not answer within {SMI_TIMEOUT_S} s (a wedged GPU or driver: "
                                         "see `dmesg` for Xid errors)", "hung": True}
        if rc != 0:
            return {"gpus": [], "error": " ".join(lines) or f"nvidia-smi exited {rc}"}
        gpus = []
        for line in lines:
            cols = [c.strip() for c in line.split(",")]
            if len(cols) != len(_SMI_FIELDS):
                raise FactProcessError(f"NvidiaSmiGpus: unexpected nvidia-smi line {line!r}")
            index, name, uuid, memory, cap, bus, driver = cols
            try:
                gpus.append({
                    "index": int(index),
                    "name": name,
                    "uuid": uuid,
                    "memory_mib": None if memory.startswith("[") else int(float(memory)),
                    "compute_cap": None if cap.startswith("[") else cap,
                    "pci_bus_id": bus,
                    "driver_version": driver,
                })
            except ValueError as e:
                raise FactProcessError(f"NvidiaSmiGpus: {e} in {line!r}") from e
        return {"gpus": gpus, "error": None}


def userspace_version(packages: dict) -> str | None:
    """Upstream version of the installed userspace driver (libnvidia-compute first)."""
    installed = packages.get("installed", {})
    for prefix in USERSPACE_PACKAGES:
        for name in sorted(installed):
            if name.startswith(prefix) and not name.startswith("nvidia-driver-pinning"):
                version = upstream_version(installed[name])
                if version:
                    return version
    return None


_KERNEL_IMAGE = re.compile(r"^linux-image-(?:unsigned-)?(?P<release>\d.*)$")


def _release_key(release: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", release)]


def boot_kernel(kernel: dict) -> str | None:
    """The installed kernel the next boot starts by default (the newest linux-image), where it is newer than the
    running one; else None."""
    releases = {m["release"] for m in map(_KERNEL_IMAGE.match, kernel.get("packages", {})) if m}
    newest = max(releases, key=_release_key, default=None)
    running = kernel.get("running")
    return newest if newest and running and _release_key(newest) > _release_key(running) else None


DriverStateName = Literal["ok", "reboot_required", "packages_differ", "not_installed", "module_only"]


class DriverStateDict(TypedDict):
    state: DriverStateName
    installed: str | None  # userspace driver version
    loaded: str | None     # loaded kernel module version
    modules: str | None    # driver the running kernel's NVIDIA modules package carries
    flavour: str | None    # "open" or "proprietary" (loaded module)
    reason: str            # one line for people: what differs, and what follows


def driver_state(packages: dict, module: dict, kernel: dict | None = None) -> DriverStateDict:
    """Compare the installed userspace driver with the loaded kernel module and, where ``kernel`` (the
    KernelPackages fact) lists NVIDIA's precompiled modules, with the modules package of the running kernel.

    state: ``ok`` (equal), ``reboot_required`` (module missing or different; a reboot loads the installed
    one), ``packages_differ`` (the modules package of the running kernel is another driver than userspace,
    or there is none for it while others are installed: a reboot cannot fix it, the next boot gives an NVRM
    API mismatch), ``not_installed``, or ``module_only`` (a module is loaded but no driver package is
    installed: preinstalled drivers outside dpkg, as on some appliances). Where the running kernel's modules
    do not match but the newer kernel the next boot starts has a modules package of the userspace driver (an
    upgrade brought both), the state is ``reboot_required`` and the reason names that kernel.
    """
    installed = userspace_version(packages)
    loaded = module.get("version")
    release = (kernel or {}).get("running")
    modules = modules_for(kernel or {}, release)
    others = sorted(m["kernel"] for m in map(MODULES_PACKAGE.match, (kernel or {}).get("packages", {})) if m)
    differs = installed is not None and modules is not None and modules[1] != installed
    unbuilt = installed is not None and not modules and not loaded and bool(others)
    booting = boot_kernel(kernel or {}) if differs or unbuilt else None
    boot_modules = modules_for(kernel or {}, booting) if booting else None
    state: DriverStateName
    if boot_modules and boot_modules[1] == installed:
        state, reason = "reboot_required", (
            f"the running kernel {release} has "
            + (f"{modules[0]} with module {modules[1]}" if modules else "no linux-modules-nvidia package")
            + f", userspace driver {installed} is installed; the next boot starts kernel {booting}, whose "
            f"{boot_modules[0]} carries {boot_modules[1]}: a reboot into {booting} loads it")
    elif differs:
        state, reason = "packages_differ", (
            f"{modules[0]} carries module {modules[1]}, userspace driver {installed} is installed"
            + (f", module {loaded} is loaded" if loaded else ""))
    elif unbuilt:
        state, reason = "packages_differ", (
            f"no linux-modules-nvidia package for the running kernel {release} (installed for "
            f"{', '.join(others)}): no nvidia module can load")
    elif installed is None and loaded is None:
        state, reason = "not_installed", "no driver package installed and no module loaded"
    elif installed is None:
        state, reason = "module_only", f"module {loaded} loaded, no driver package installed"
    elif loaded is None:
        state, reason = "reboot_required", f"driver {installed} installed but no nvidia module is loaded"
    elif loaded != installed:
        state, reason = "reboot_required", f"module {loaded} loaded, userspace driver {installed} installed"
    else:
        state, reason = "ok", f"module {loaded} = userspace {installed}"
    return {"state": state, "installed": installed, "loaded": loaded, "modules": modules[1] if modules else None,
            "flavour": module.get("flavour"), "reason": reason}


class SecureBootDict(TypedDict):
    enabled: bool | None       # the firmware's SecureBoot variable (None: no EFI variables: legacy boot or unknown)
    mok_enrolled: bool | None  # DKMS's signing key is enrolled (None: no key yet, or no mokutil to ask)


class SecureBoot(FactBase[SecureBootDict]):
    """Whether Secure Boot is on, and whether the key DKMS signs modules with (Ubuntu's
    `/var/lib/shim-signed/mok/MOK.der`) is enrolled: a DKMS-built driver module loads under Secure Boot only then.
    ``efivars``: the firmware variables' directory (a test points it elsewhere)."""

    default = dict

    def command(self, efivars: str = "/sys/firmware/efi/efivars", mok: str = "/var/lib/shim-signed/mok/MOK.der") -> str:
        e, k = shlex.quote(efivars), shlex.quote(mok)
        return (f"f=$(ls {e}/SecureBoot-* 2>/dev/null | head -n1); "
                "if [ -n \"$f\" ]; then echo \"enabled=$(od -An -t u1 -j4 -N1 \"$f\" | tr -d ' ')\"; else echo enabled=; fi; "
                f"if [ -f {k} ] && command -v mokutil >/dev/null 2>&1; then "
                f"if mokutil --test-key {k} 2>&1 | grep -q 'already enrolled'; then echo mok=1; else echo mok=0; fi; "
                "else echo mok=; fi")

    def process(self, output: list[str]) -> SecureBootDict:
        values = dict(line.split("=", 1) for line in output if "=" in line)
        flag = lambda v: None if not v else v.strip() == "1"  # noqa: E731
        return {"enabled": flag(values.get("enabled")), "mok_enrolled": flag(values.get("mok"))}

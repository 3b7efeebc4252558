"""NVIDIA driver keys: its source, branch and how it is held (deploys/nvidia_driver.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from deploys.schema.base import DEB_PACKAGE, ComponentKeys, ReadOnlyRoot, Url, _key
from deploys.schema.base import KeyRuleError


class NvidiaDriverKeys(ComponentKeys):
    """The NVIDIA driver, its source and how it is held (deploys/nvidia_driver.py)."""

    nvidia_driver_source: Literal["cuda_repo", "ubuntu_archive", "preinstalled"] = _key(
        "cuda_repo",
        description="where the driver comes from: NVIDIA's CUDA apt repo, the Ubuntu archive, or `preinstalled` "
        "(DGX OS: install nothing, verify and hold)",
    )
    nvidia_driver_branch: str = _key("580", description="driver branch to install and hold", pattern=r"^[0-9]{3}$")
    nvidia_driver_open: bool = _key(True, description="open kernel modules (required by Blackwell and GB10)")
    nvidia_kernel_headers: bool = _key(
        True, description="install the running kernel's headers (`linux-headers-$(uname -r)`) before the driver, as "
        "NVIDIA's own role does: DKMS builds the module against them, and a minimal or cloud image lacks them (the "
        "flavour's headers metapackage may name another kernel). Not with `preinstalled`",
    )
    nvidia_driver_packages: list[str] | None = _key(
        None, description="packages to install; unset = the source's default set for branch and flavour"
    )
    nvidia_repo_url: Url = _key(
        "https://developer.download.nvidia.com/compute/cuda/repos",
        description="base of NVIDIA's CUDA apt repo; `/<distro>/<arch>/` (e.g. `ubuntu2404/sbsa`) is appended",
        pattern=r"^(https?|file)://\S+$",
    )
    nvidia_repo_key_url: Url = _key(
        "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/3bf863cc.pub",
        description="signing key of the CUDA repo, fetched on the node and checked against the fingerprint",
        pattern=r"^(https?|file)://\S+$",
    )
    nvidia_repo_key_fingerprint: str = _key(
        "EB693B3035CD5710E231E123A4B469963BF863CC",
        description="full fingerprint the repo key must have (40 hex); a different key is refused",
        pattern=r"^[0-9A-F]{40}$",
    )
    allow_driver_change: bool = _key(
        False, description="move a host that runs another driver branch to `nvidia_driver_branch` (else refused)"
    )
    allow_reboot: bool = _key(
        False,
        description="reboot when the loaded module differs from the installed driver (else the host is stopped "
        "and reported)",
    )
    nvidia_kernel_hold: str | None = _key(
        None, description="kernel to hold with the driver: `running` (the one the node runs) or a release "
        "(`uname -r` form, e.g. `6.17.0-1031-nvidia`); its image/modules/headers, NVIDIA's precompiled modules "
        "package for it and the metapackages that would bring the next kernel (GB10 profiles: `running`)",
        pattern=r"^(running|[0-9][0-9A-Za-z.+~-]*)$",
    )
    nvidia_module_root: ReadOnlyRoot = _key(
        "/", description="where `sys/module/nvidia` and `proc/driver/nvidia` are read (`/`; the sandbox's stand-in differs)"
    )

    @model_validator(mode="after")
    def _driver_rules(self) -> NvidiaDriverKeys:
        if self.nvidia_driver_packages is not None and self.nvidia_driver_source == "preinstalled":
            raise KeyRuleError(
                "nvidia_driver_packages", self.nvidia_driver_packages, "unset with nvidia_driver_source preinstalled"
            )
        for name in self.nvidia_driver_packages or []:
            if not DEB_PACKAGE.fullmatch(name):
                raise KeyRuleError("nvidia_driver_packages", name,
                                   "Debian package names (no version: the branch pins it)")
        return self

    @property
    def driver_packages(self) -> list[str]:
        """What to install for this source, branch and flavour (empty for preinstalled)."""
        if self.nvidia_driver_packages is not None:
            return list(self.nvidia_driver_packages)
        b = self.nvidia_driver_branch
        if self.nvidia_driver_source == "cuda_repo":
            # NVIDIA's recommended order: the branch pinning package, then the unversioned driver metapackage.
            return [f"nvidia-driver-pinning-{b}", "nvidia-open" if self.nvidia_driver_open else "cuda-drivers"]
        if self.nvidia_driver_source == "ubuntu_archive":
            flavour = "-open" if self.nvidia_driver_open else ""
            return [f"nvidia-headless-{b}-server{flavour}", f"nvidia-utils-{b}-server"]
        return []

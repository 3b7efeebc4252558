"""Container runtime keys: Podman, the NVIDIA container toolkit, CDI, registries
(deploys/container_runtime.py). The registry auth file is checked by deploys/schema/control_files.py once
the keys parse."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from deploys.schema.base import DEB_PACKAGE, CdiSpecFile, ComponentKeys, ControlSecret, Url, _key
from deploys.schema.base import KeyRuleError


class RegistryMirror(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    location: str = Field(pattern=r"^[A-Za-z0-9][\w.:/-]*$")
    insecure: bool = False


class Registry(BaseModel):
    """One `[[registry]]` of containers-registries.conf(5)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    prefix: str = Field(pattern=r"^[A-Za-z0-9][\w.:/-]*$")
    location: str | None = Field(None, pattern=r"^[A-Za-z0-9][\w.:/-]*$")
    insecure: bool = False
    mirrors: list[RegistryMirror] = []


class ContainerRuntimeKeys(ComponentKeys):
    """Podman, the NVIDIA container toolkit, CDI, registries, the image pull (deploys/container_runtime.py)."""

    podman_min_version: str = _key("4.9.3", description="oldest Podman accepted (Ubuntu 24.04 ships 4.9.3)",
                                   pattern=r"^[0-9]+(\.[0-9]+){1,2}$")
    nvidia_toolkit_version: str = _key(
        "1.18.2-1",
        description="NVIDIA container toolkit version (Debian version), installed exactly and held; >= 1.18 "
        "(the CDI refresh unit)",
        pattern=r"^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.~+]+)?$",
    )
    nvidia_toolkit_packages: list[str] = _key(
        ["nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
         "libnvidia-container1"],
        description="toolkit packages, all installed at `nvidia_toolkit_version` (Debian package names)",
    )
    nvidia_toolkit_repo_url: Url = _key(
        "https://nvidia.github.io/libnvidia-container/stable/deb",
        description="NVIDIA's toolkit apt repo; `/<dpkg arch>/` is appended", pattern=r"^(https?|file)://\S+$",
    )
    nvidia_toolkit_key_url: Url = _key(
        "https://nvidia.github.io/libnvidia-container/gpgkey", description="signing key of the toolkit repo",
        pattern=r"^(https?|file)://\S+$",
    )
    nvidia_toolkit_key_fingerprint: str = _key(
        "C95B321B61E88C1809C4F759DDCAE044F796ECB0", description="full fingerprint the toolkit repo key must have",
        pattern=r"^[0-9A-F]{40}$",
    )
    cdi_no_additional_gids: bool = _key(
        True, description="generate CDI specs without `additionalGids` (Podman < 5.1 cannot read them; toolkit >= 1.19 "
        "adds them otherwise)",
    )
    cdi_spec_path: CdiSpecFile = _key(
        "/var/run/cdi/nvidia.yaml", description="the one CDI spec, written by the toolkit's nvidia-cdi-refresh unit"
    )
    registries: list[Registry] = _key(
        [], description="registries.conf.d entries: `{prefix, location, insecure, mirrors: [{location, insecure}]}`"
    )
    registry_auth_file: ControlSecret | None = _key(
        None, description="control-node path of a registry auth.json (outside the repo, mode 0600); copied to the "
        "node 0600, never printed",
    )

    @model_validator(mode="after")
    def _toolkit_has_cdi_refresh(self) -> ContainerRuntimeKeys:
        from packaging.version import Version

        for name in self.nvidia_toolkit_packages:
            if not DEB_PACKAGE.fullmatch(name):
                raise KeyRuleError("nvidia_toolkit_packages", name,
                                   "Debian package names (no version: nvidia_toolkit_version pins it)")
        if not self.nvidia_toolkit_packages:
            raise KeyRuleError("nvidia_toolkit_packages", [], "at least one package")

        if Version(self.nvidia_toolkit_version.split("-")[0]) < Version("1.18"):
            raise KeyRuleError("nvidia_toolkit_version", self.nvidia_toolkit_version,
                               ">= 1.18 (older toolkits have no nvidia-cdi-refresh unit)")
        return self

    @property
    def toolkit_minor(self) -> tuple[int, int]:
        major, minor = self.nvidia_toolkit_version.split(".")[:2]
        return int(major), int(minor)

"""The NVIDIA apt repos the toolkit adds, and the sources a node already has for them.

NVIDIA's own instructions leave `cuda-keyring`'s `.list` (Signed-By `cuda-archive-keyring.gpg`) and
`nvidia-container-toolkit.list` (Signed-By `nvidia-container-toolkit-keyring.gpg`, its URI ending in the
literal `$(ARCH)` apt expands) on most GPU hosts. A second source for the same URI with another keyring makes
apt refuse every source list (`E: Conflicting values set for option Signed-By`, `E: The list of sources could
not be read`): no update, no install, no security upgrades on the whole host. The toolkit's own source, with
its fingerprint-checked keyring, replaces such a source: each such entry is disabled where it is, never the file
around it (a hand-added CUDA line in `/etc/apt/sources.list` is commented out, its distribution lines and their
security updates stay; a deb822 stanza gets `Enabled: no`), each change marked with what it was and the file's
first state kept beside it (`<file>.inference-nodes-orig`), before the run's first apt command
(files/apt/nvidia_sources.py). Preflight names each entry first.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import StringCommand

from deploys.run.reads import operation, read
from deploys.schema import NodeConfig
from deploys.ops import fail_host
from facts.apt import AptSourcesNaming, nvidia_sources_command

DEB_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}  # node_arch -> Debian's name
CUDA_SOURCE = "/etc/apt/sources.list.d/inference-nodes-nvidia-cuda.sources"
TOOLKIT_SOURCE = "/etc/apt/sources.list.d/inference-nodes-nvidia-container-toolkit.sources"


def cuda_repo_path(os_release: dict, arch: str) -> str:
    """'ubuntu2404/x86_64' or 'ubuntu2404/sbsa' (NVIDIA's name for arm64 servers, GB10 included)."""
    distro = f"{os_release.get('id', '')}{os_release.get('version_id', '').replace('.', '')}"
    return f"{distro}/{'sbsa' if arch in ('aarch64', 'arm64') else arch}"


def cuda_repo_uri(repo_url: str, repo_path: str) -> str:
    return f"{repo_url.rstrip('/')}/{repo_path}"


def toolkit_repo_uri(repo_url: str, deb_arch: str) -> str:
    return f"{repo_url.rstrip('/')}/{deb_arch}"


def sources_args(cfg: NodeConfig) -> dict:
    """AptSourcesNaming's arguments: the URIs the toolkit's own sources name (the toolkit's also as NVIDIA's
    `.list` writes it, with apt's `$(ARCH)`; the CUDA repo's as its root, which every distro's path is under),
    and those own files, which never count."""
    toolkit = cfg.nvidia_toolkit_repo_url
    uris = [toolkit_repo_uri(toolkit, DEB_ARCH[cfg.node_arch]), toolkit_repo_uri(toolkit, "$(ARCH)")]
    if cfg.nvidia_driver_source == "cuda_repo":
        uris.append(cfg.nvidia_repo_url.rstrip("/") + "/")
    return {"uris": tuple(uris), "own": (CUDA_SOURCE, TOOLKIT_SOURCE)}


@operation()
def foreign_sources_disabled(uris: tuple[str, ...], own: tuple[str, ...]):
    """Disable every other apt entry for the toolkit's repos, entry by entry (module docstring).

    + uris: the repo URIs the toolkit's own sources name
    + own: the toolkit's own source files
    """
    found = read(host, AptSourcesNaming, uris=uris, own=own)
    if found["mixed"]:
        yield fail_host(f"{host.name}: a deb822 apt stanza names an NVIDIA repo the toolkit's own source names beside "
                        f"other repos ({'; '.join(found['mixed'])}): give the NVIDIA URI a stanza of its own (or "
                        "remove it), so it can be disabled without the others")
        return
    if not found["entries"]:
        host.noop("no other apt source names the NVIDIA repos")
        return
    logger.info(f"{host.name}: disabling apt entries for the repos the toolkit's own sources name (a second "
                f"Signed-By for one URI breaks apt): {', '.join(found['entries'])}")
    yield StringCommand(nvidia_sources_command("disable", uris, own))

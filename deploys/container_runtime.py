"""Container runtime: Podman from the distribution, the NVIDIA container toolkit at a pinned version,
one CDI spec that the host's Podman can read, registries, credentials, and the service image by digest.

One spec, one owner: the toolkit's nvidia-cdi-refresh unit writes /var/run/cdi/nvidia.yaml (tmpfs,
regenerated at every boot and when the driver changes); a hand-made /etc/cdi/nvidia.yaml would shadow
nothing but go stale, so it is removed. Toolkit >= 1.19 adds `additionalGids` (CDI 0.7.0), which
Podman 4.9.3 (Ubuntu 24.04) cannot read; the refresh unit's env file turns that off.
"""

from __future__ import annotations

from io import StringIO

from packaging.version import Version
from pyinfra import host, logger
from pyinfra.api import FunctionCommand, QuoteString, StringCommand, deploy
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File

from deploys.apt_sources import DEB_ARCH, TOOLKIT_SOURCE, toolkit_repo_uri
from deploys.apt_state import APT_READS, apt_lists_updated
from deploys.run.held import release_held
from deploys.run.reads import expect, operation, read, service_reads
from deploys.inventory import node_config
from deploys.ops import (
    file_absent,
    packages_installed,
    unit_running,
    apt_held,
    atomic_put,
    fail_host,
    flat_repo_source,
    follow_up_done,
    follow_up_reads,
    follow_up_stamp,
    keyring_verified,
    lock_waiting,
    secret_file,
    shown,
)
from deploys.schema import ContainerRuntimeKeys, NodeConfig
from facts.apt import AptHolds, KeyringFingerprints
from facts.containers import CdiSpec, PodmanImageDigests, PodmanVersion
from facts.host import ManagedFiles
from facts.nvidia import NvidiaKernelModule



HEADER = "# Managed by inference-nodes (deploys/container_runtime.py); local edits are overwritten.\n"
TOOLKIT_KEYRING = "/etc/apt/keyrings/inference-nodes-nvidia-container-toolkit.gpg"
REFRESH_ENV = "/etc/nvidia-container-toolkit/nvidia-cdi-refresh.env"
STALE_SPEC = "/etc/cdi/nvidia.yaml"
REGISTRIES_FILE = "/etc/containers/registries.conf.d/90-inference-nodes.conf"
AUTH_FILE = "/etc/inference-nodes/secrets/registry-auth.json"
LISTS_STAMP = "container-runtime-apt-lists"  # follow-up stamps (deploys/ops.py follow_up_done)
REFRESH_STAMP = "container-runtime-cdi-refresh"


def render_toolkit_source(cfg: ContainerRuntimeKeys, deb_arch: str) -> str:
    return flat_repo_source(HEADER, toolkit_repo_uri(cfg.nvidia_toolkit_repo_url, deb_arch), TOOLKIT_KEYRING)


def render_refresh_env(cfg: ContainerRuntimeKeys) -> str:
    if cfg.cdi_no_additional_gids:
        return (f"{HEADER}# Podman < 5.1 rejects CDI specs with additionalGids (CDI 0.7.0).\n"
                "NVIDIA_CTK_CDI_GENERATE_FEATURE_FLAGS=no-additional-gids-for-device-nodes\n")
    return f"{HEADER}# additionalGids allowed (cdi_no_additional_gids: false): needs Podman >= 5.1\n"


def render_registries(cfg: ContainerRuntimeKeys) -> str:
    out = [HEADER]
    for reg in cfg.registries:
        out.append(f'\n[[registry]]\nprefix = "{reg.prefix}"\nlocation = "{reg.location or reg.prefix}"\n')
        if reg.insecure:
            out.append("insecure = true\n")
        for mirror in reg.mirrors:
            out.append(f'\n[[registry.mirror]]\nlocation = "{mirror.location}"\n')
            if mirror.insecure:
                out.append("insecure = true\n")
    return "".join(out)


def cdi_problem(spec: dict, gpu_indices: list[int], loaded_driver: str | None, no_gids: bool) -> str | None:
    """Why the spec must be regenerated (None when it is current)."""
    if not spec.get("present"):
        return "no CDI spec yet"
    if loaded_driver and spec.get("driver_version") and spec["driver_version"] != loaded_driver:
        return f"spec was generated for driver {spec['driver_version']}, {loaded_driver} is loaded"
    if no_gids and spec.get("additional_gids"):
        return "spec carries additionalGids, which Podman < 5.1 cannot read"
    missing = [i for i in gpu_indices if str(i) not in spec.get("devices", [])]
    if missing:
        return f"GPU index {', '.join(map(str, missing))} is not a device of the spec"
    return None


@operation()
def toolkit_installed(packages: list[str], version: str):
    """Every toolkit package at exactly ``version`` (an inventory change moves held packages too).

    + packages: toolkit package names
    + version: Debian version
    """
    installed = read(host, DebPackages)
    missing = [p for p in packages if version not in installed.get(p, [])]
    if not missing:
        host.noop(f"{', '.join(packages)} at {version}")
        return
    # fresh lists first: an interrupted earlier run may have added the source without updating them
    yield lock_waiting("apt-get", "update", "-qq")
    yield StringCommand("DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "--allow-downgrades",
                        "--allow-change-held-packages", *(QuoteString(f"{p}={version}") for p in packages))


@operation()
def podman_at_least(minimum: str):
    """Fail the host when Podman is missing or older than ``minimum``.

    + minimum: oldest acceptable version
    """
    version = read(host, PodmanVersion)
    if version is None or Version(version) < Version(minimum):
        yield fail_host(f"{host.name}: Podman {version or 'is not installed'}; podman_min_version is {minimum}")
        return
    host.noop(f"Podman {version} >= {minimum}")


def _check_spec_after_refresh(state, host, path: str, gpu_indices: list[int], root: str, no_gids: bool):
    spec = read(host, CdiSpec, path=path)
    loaded = read(host, NvidiaKernelModule, root=root).get("version")
    problem = cdi_problem(spec, gpu_indices, loaded, no_gids)
    if problem:
        host.log_styled(f"{path} after nvidia-cdi-refresh: {problem}; devices: "
                        f"{', '.join(spec.get('devices', [])) or 'none'}", fg="red", log_func=logger.error)
        return False
    return True


@operation()
def cdi_spec_current(path: str, gpu_indices: list[int], module_root: str, no_additional_gids: bool):
    """Regenerate the CDI spec through nvidia-cdi-refresh when it is missing or stale; then every GPU
    index the service uses must be a device (`nvidia.com/gpu=N`), else the host fails naming the index.

    + path: the spec the refresh unit writes
    + gpu_indices: indices the service will request
    + module_root: where the loaded module's version is read
    + no_additional_gids: a spec with additionalGids is stale
    """
    spec = read(host, CdiSpec, path=path)
    loaded = read(host, NvidiaKernelModule, root=module_root).get("version")
    problem = cdi_problem(spec, gpu_indices, loaded, no_additional_gids)
    if problem is None:
        host.noop(f"{path} lists nvidia.com/gpu={','.join(map(str, gpu_indices))} for driver {loaded}")
        return
    logger.info(f"{host.name}: regenerating the CDI spec ({problem})")
    yield StringCommand("systemctl", "restart", "nvidia-cdi-refresh.service")
    yield FunctionCommand(_check_spec_after_refresh, (path, gpu_indices, module_root, no_additional_gids), {})


@operation()
def image_present(image: str, digest: str | None, authfile: str | None = None):
    """Pull the service image by digest unless an image answering to that digest is present (its own manifest
    digest, or an index digest among its repo digests); a pull that brings another digest is an error.

    + image: reference without digest
    + digest: the pinned manifest digest (None: a moving tag, allowed by allow_unpinned_image)
    + authfile: registry credentials on the node
    """
    ref = f"{image}@{digest}" if digest else image
    present = read(host, PodmanImageDigests, ref=ref)
    if digest and digest in present:
        host.noop(f"{ref} present")
        return
    if not digest and present:
        host.noop(f"{image} present (unpinned: allow_unpinned_image)")
        return
    logger.info(f"{host.name}: pulling {ref} (large images take minutes; podman names each layer as it copies it)")
    args = ["podman", "pull"]
    if authfile:
        args += ["--authfile", QuoteString(authfile)]
    yield shown(StringCommand(*args, QuoteString(ref)))
    if digest:
        yield FunctionCommand(_check_digest_after_pull, (ref, digest), {})


def _check_digest_after_pull(state, host, ref: str, digest: str):
    """The pulled reference must carry the pinned digest (read afresh: a command ran on this host)."""
    pulled = read(host, PodmanImageDigests, ref=ref)
    if digest not in pulled:
        host.log_styled(f"pulled {ref} but it answers to {', '.join(pulled) or 'no digest podman shows'}, want {digest}",
                        fg="red", log_func=logger.error)
        return False
    return True


@deploy("Container runtime")
def container_runtime():
    cfg: NodeConfig = node_config()
    batch = (TOOLKIT_SOURCE, REFRESH_ENV, REGISTRIES_FILE)  # read in one round trip
    expect([*APT_READS, (PodmanVersion, {}), (KeyringFingerprints, {"path": TOOLKIT_KEYRING}), (ManagedFiles, {"paths": batch}),
            *follow_up_reads(LISTS_STAMP, REFRESH_STAMP), (AptHolds, {}), (File, {"path": STALE_SPEC}),
            *service_reads("nvidia-cdi-refresh.path"), *service_reads("nvidia-cdi-refresh.service"),
            (CdiSpec, {"path": cfg.cdi_spec_path}), (NvidiaKernelModule, {"root": cfg.nvidia_module_root}),
            (ManagedFiles, {"paths": (AUTH_FILE,)}), (File, {"path": AUTH_FILE}),
            (PodmanImageDigests, {"ref": cfg.image_ref})])
    # catatonit: the init a unit with RunInit=true (deployment A) needs; a Recommends that minimal installs skip
    apt_lists_updated(name="Update apt lists when older than a day (waits for a held lock)", cache_time=86400)
    packages_installed(name="Install Podman from the distribution", packages=["podman", "catatonit"])
    podman_at_least(name=f"Check Podman >= {cfg.podman_min_version}", minimum=cfg.podman_min_version)

    packages_installed(name="Install what fetching and checking repo keys needs", packages=["curl", "gpg", "ca-certificates"])
    keyring_verified(
        name="Install the container toolkit repo key (fingerprint checked)",
        url=cfg.nvidia_toolkit_key_url,
        fingerprint=cfg.nvidia_toolkit_key_fingerprint,
        dest=TOOLKIT_KEYRING,
        resets=follow_up_stamp(LISTS_STAMP),
    )
    deb_arch = DEB_ARCH[cfg.node_arch]  # preflight refused a node of another architecture
    source = render_toolkit_source(cfg, deb_arch)
    atomic_put(
        batch=batch,
        name="Add NVIDIA's container toolkit repo",
        src=StringIO(source),
        dest=TOOLKIT_SOURCE,
        user="root", group="root", mode="0644",
        resets=follow_up_stamp(LISTS_STAMP),
    )
    follow_up_done(name="Update apt lists after the toolkit source changed", stamp=LISTS_STAMP,
                   command=lock_waiting("apt-get", "update", "-qq"), paths=(TOOLKIT_SOURCE,), contents=(source,))
    version = cfg.nvidia_toolkit_version
    toolkit_installed(name=f"Install the NVIDIA container toolkit {version}", packages=cfg.nvidia_toolkit_packages,
                      version=version)
    apt_held(name="Hold the container toolkit", packages=cfg.nvidia_toolkit_packages)

    refresh_env = render_refresh_env(cfg)
    atomic_put(
        batch=batch,
        name="Configure CDI generation for this Podman",
        src=StringIO(refresh_env),
        dest=REFRESH_ENV,
        user="root", group="root", mode="0644", create_remote_dir=True,
        resets=follow_up_stamp(REFRESH_STAMP),
    )
    file_absent(name=f"Remove a second, hand-made CDI spec ({STALE_SPEC})", path=STALE_SPEC)
    unit_running(name="Regenerate CDI specs when the driver changes", unit="nvidia-cdi-refresh.path",
                    running=True, enabled=True)
    unit_running(name="Regenerate CDI specs at boot", unit="nvidia-cdi-refresh.service", running=None,
                    enabled=True)  # a oneshot: enabled, not kept running
    follow_up_done(name="Regenerate the CDI spec after a configuration change", stamp=REFRESH_STAMP,
                   command="systemctl restart nvidia-cdi-refresh.service", paths=(REFRESH_ENV,),
                   contents=(refresh_env,))
    cdi_spec_current(
        name="Check the CDI spec lists every GPU the service uses",
        path=cfg.cdi_spec_path,
        gpu_indices=cfg.gpu_indices,
        module_root=cfg.nvidia_module_root,
        no_additional_gids=cfg.cdi_no_additional_gids,
    )

    atomic_put(
        batch=batch,
        name="Configure registries (registries.conf.d)",
        src=StringIO(render_registries(cfg)),
        dest=REGISTRIES_FILE,
        user="root", group="root", mode="0644",
    )
    if cfg.registry_auth_file:
        secret_file(name="Install registry credentials (0600, never printed)", src=cfg.registry_auth_file,
                    dest=AUTH_FILE)
    else:  # credentials taken out of the inventory leave the node too (decided from the file being there)
        file_absent(name="Remove registry credentials no longer in the inventory", path=AUTH_FILE)
    if release_held():  # the image is the release's: it stays as it is (deploys/run/held.py)
        return
    image_present(
        name="Pull the service image by digest",
        image=cfg.image,
        digest=cfg.image_digest,
        authfile=AUTH_FILE if cfg.registry_auth_file else None,
    )

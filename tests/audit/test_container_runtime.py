"""Audit of the container runtime: Podman version, toolkit pinned and held, the one CDI spec (parsed with
pyyaml) listing every GPU the service uses and resolvable by Podman, registries, credentials, image by digest."""

import yaml
from packaging.version import Version

REFRESH_ENV = "/etc/nvidia-container-toolkit/nvidia-cdi-refresh.env"
AUTH_FILE = "/etc/inference-nodes/secrets/registry-auth.json"
REGISTRIES_FILE = "/etc/containers/registries.conf.d/90-inference-nodes.conf"


def test_podman_at_least_the_minimum(node):
    version = node.host.check_output("podman --version").split()[-1]
    assert Version(version) >= Version(node.cfg.podman_min_version)


def test_toolkit_pinned_and_held(node):
    held = set(node.host.check_output("apt-mark showhold").split())
    for name in node.cfg.nvidia_toolkit_packages:
        pkg = node.host.package(name)
        assert pkg.is_installed and pkg.version == node.cfg.nvidia_toolkit_version, name
        assert name in held, f"{name} not held"


def test_one_cdi_spec_listing_every_gpu_the_service_uses(node):
    spec = yaml.safe_load(node.host.file(node.cfg.cdi_spec_path).content_string)
    names = {str(d["name"]) for d in spec["devices"]}
    assert {str(i) for i in node.cfg.gpu_indices} <= names
    assert not node.host.file("/etc/cdi/nvidia.yaml").exists, "a second spec would go stale"
    if node.cfg.cdi_no_additional_gids:
        assert "additionalGids" not in node.host.file(node.cfg.cdi_spec_path).content_string
        assert node.host.file(REFRESH_ENV).contains("no-additional-gids-for-device-nodes")
    assert node.host.service("nvidia-cdi-refresh.path").is_enabled
    assert node.host.service("nvidia-cdi-refresh.service").is_enabled


def test_spec_matches_the_loaded_driver(node):
    root = node.cfg.nvidia_module_root.rstrip("/")
    loaded = node.host.check_output(f"cat {root}/sys/module/nvidia/version").strip()
    assert f"libcuda.so.{loaded}" in node.host.file(node.cfg.cdi_spec_path).content_string


def test_service_image_present_by_digest(node):
    """Present and answering to the pinned digest: its own manifest digest, or a multi-arch index digest among
    its repo digests (the fact the deploy reads)."""
    from facts.containers import PodmanImageDigests

    fact = PodmanImageDigests()
    digests = fact.process(node.host.check_output(fact.command(ref=node.cfg.image_ref)).splitlines())
    assert digests, f"{node.cfg.image_ref} is not on the node"
    if node.cfg.image_digest:
        assert node.cfg.image_digest in digests


def test_podman_resolves_every_cdi_device_of_the_service(node):
    devices = " ".join(f"--device nvidia.com/gpu={i}" for i in node.cfg.gpu_indices)
    paths = " ".join(f"/dev/nvidia{i}" for i in node.cfg.gpu_indices)
    cmd = f"podman run --rm --network=host --pull=never {devices} {node.cfg.image_ref} ls {paths}"
    result = node.host.run(cmd)
    assert result.rc == 0, result.stderr


def test_registries_and_credentials(node):
    if node.cfg.registries:
        conf = node.host.file(REGISTRIES_FILE)
        assert conf.mode == 0o644
        for reg in node.cfg.registries:
            assert f'prefix = "{reg.prefix}"' in conf.content_string
    auth = node.host.file(AUTH_FILE)
    if node.cfg.registry_auth_file:
        assert auth.is_file and auth.user == "root" and auth.mode == 0o600
        assert node.host.file("/etc/inference-nodes/secrets").mode == 0o700
    else:
        assert not auth.exists, f"{AUTH_FILE} is on the node but the inventory configures no registry_auth_file"


def test_no_other_apt_source_names_the_nvidia_repos(node):
    """A second source for one of the toolkit's repo URIs with its own Signed-By (NVIDIA's cuda-keyring and
    container-toolkit `.list` files) makes apt refuse every source list; the deploy disables such entries."""
    from deploys.apt_sources import sources_args
    from facts.apt import AptSourcesNaming

    fact = AptSourcesNaming()
    found = fact.process(node.host.check_output(fact.command(**sources_args(node.cfg))).splitlines())
    assert found == {"entries": [], "mixed": []}, f"apt entries besides the toolkit's own name its NVIDIA repos: {found}"
    listed = node.host.run("apt-get indextargets --format '$(URI)'")  # apt reads every source list (no network)
    assert listed.rc == 0 and "Conflicting values" not in listed.stderr, listed.stderr

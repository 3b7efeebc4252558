"""CDI spec parsing (pyyaml) on toolkit-shaped specs, staleness rules, and the runtime's rendered files."""

import os
from pathlib import Path

import pytest
from pyinfra.api.exceptions import FactProcessError

from deploys.container_runtime import cdi_problem, render_refresh_env, render_registries, render_toolkit_source
from deploys.schema import ContainerRuntimeKeys, InventoryValidationError, NodeConfig, validate_hosts
from facts.containers import CdiSpec, PodmanVersion, parse_cdi_spec
from tests.unit.profiles import profile

FIX = Path(__file__).parent / "fixtures" / "cdi"
SPEC_118 = (FIX / "toolkit-1.18-shape.yaml").read_text()
SPEC_119 = (FIX / "toolkit-1.19-shape.yaml").read_text()


def test_spec_without_additional_gids():
    spec = parse_cdi_spec(SPEC_118)
    assert spec == {"kind": "nvidia.com/gpu", "cdi_version": "0.5.0",
                    "devices": ["0", "GPU-520e01f2-cf30-6396-abef-e8e9a5233b0e", "all"],
                    "additional_gids": False, "driver_version": "580.95.05"}


def test_spec_with_additional_gids():
    spec = parse_cdi_spec(SPEC_119)
    assert spec["additional_gids"] is True and spec["cdi_version"] == "0.7.0"


def test_cdi_fact_absent_present_and_garbage():
    assert CdiSpec().process(["##inference-nodes:absent"]) == {"present": False}
    spec = CdiSpec().process(["##inference-nodes:present", *SPEC_118.splitlines()])
    assert spec["present"] and spec["devices"][0] == "0"
    with pytest.raises(FactProcessError):
        CdiSpec().process(["##inference-nodes:present", "devices: [unclosed"])
    with pytest.raises(FactProcessError):
        CdiSpec().process(["##inference-nodes:present", "just: a mapping"])


@pytest.mark.parametrize("spec,indices,loaded,no_gids,expected", [
    (SPEC_118, [0], "580.95.05", True, None),
    (SPEC_118, [0, 1], "580.95.05", True, "GPU index 1 is not a device of the spec"),
    (SPEC_118, [0], "580.105.08", True, "spec was generated for driver 580.95.05, 580.105.08 is loaded"),
    (SPEC_119, [0], "580.95.05", True, "spec carries additionalGids"),
    (SPEC_119, [0], "580.95.05", False, None),
])
def test_cdi_problem(spec, indices, loaded, no_gids, expected):
    problem = cdi_problem({"present": True, **parse_cdi_spec(spec)}, indices, loaded, no_gids)
    assert problem == expected or (expected and expected in problem)


def test_missing_spec_is_a_problem():
    assert cdi_problem({"present": False}, [0], None, True) == "no CDI spec yet"


def test_podman_version_parser():
    assert PodmanVersion().process(["podman version 4.9.3"]) == "4.9.3"
    assert PodmanVersion().process(["podman version 5.4.2"]) == "5.4.2"
    with pytest.raises(FactProcessError):
        PodmanVersion().process(["command not found"])


def test_rendered_files():
    cfg = ContainerRuntimeKeys(registries=[
        {"prefix": "registry.home.arpa", "mirrors": [{"location": "127.0.0.1:5000", "insecure": True}]}])
    conf = render_registries(cfg)
    assert '[[registry]]\nprefix = "registry.home.arpa"\nlocation = "registry.home.arpa"\n' in conf
    assert '[[registry.mirror]]\nlocation = "127.0.0.1:5000"\ninsecure = true\n' in conf
    assert "NVIDIA_CTK_CDI_GENERATE_FEATURE_FLAGS=no-additional-gids-for-device-nodes" in render_refresh_env(cfg)
    assert "FEATURE_FLAGS" not in render_refresh_env(ContainerRuntimeKeys(cdi_no_additional_gids=False))
    assert "URIs: https://nvidia.github.io/libnvidia-container/stable/deb/arm64/\nSuites: /\n" in render_toolkit_source(cfg, "arm64")



PROFILE_A = profile("rtx_pro_6000_pair")


@pytest.mark.parametrize("changes,key,expected", [
    ({"nvidia_toolkit_version": "1.17.8-1"}, "nvidia_toolkit_version", ">= 1.18"),
    ({"registry_auth_file": "/nonexistent/auth.json"}, "registry_auth_file", "an existing file"),
    ({"registries": [{"prefix": "x", "mirror": []}]}, "registries[0][mirror]", "no such field"),
])
def test_runtime_keys_rejected(changes, key, expected):
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts({"node-a": {**PROFILE_A, **changes}})
    assert f"host node-a: key '{key}'" in str(err.value) and expected in str(err.value)


def test_auth_file_must_be_private_and_outside_the_repo(tmp_path):
    loose = tmp_path / "auth.json"
    loose.write_text("{}")
    loose.chmod(0o644)
    with pytest.raises(InventoryValidationError, match="mode 0600"):
        validate_hosts({"node-a": {**PROFILE_A, "registry_auth_file": str(loose)}})
    inside = Path(os.getcwd()) / "auth-test.json"
    inside.write_text("{}")
    try:
        inside.chmod(0o600)
        with pytest.raises(InventoryValidationError, match="outside the repository"):
            validate_hosts({"node-a": {**PROFILE_A, "registry_auth_file": str(inside)}})
    finally:
        inside.unlink()
    loose.chmod(0o600)
    assert validate_hosts({"node-a": {**PROFILE_A, "registry_auth_file": str(loose)}})


def test_other_sources_for_the_nvidia_repos_are_found_as_apt_reads_them(tmp_path):
    """NVIDIA's cuda-keyring and container-toolkit `.list` files (the toolkit's URI with apt's `$(ARCH)`), as
    the fact's own command finds them in a real directory; commented lines, other repos and the toolkit's own
    sources do not count."""
    import subprocess

    from deploys.apt_sources import CUDA_SOURCE, TOOLKIT_SOURCE, sources_args
    from facts.apt import AptSourcesNaming

    cfg = NodeConfig.model_validate({**profile("rtx_pro_6000_pair"), "nvidia_repo_url": "http://r.example/cuda/repos",
                                     "nvidia_toolkit_repo_url": "http://r.example/libnvidia-container/stable/deb"})
    etc = tmp_path / "apt"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "sources.list").write_text("deb http://deb.debian.org/debian trixie main\n")
    files = {
        "cuda-ubuntu2404-x86_64.list": "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
                                       "http://r.example/cuda/repos/ubuntu2404/x86_64/ /\n",
        "nvidia-container-toolkit.list": "deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] "
                                         "http://r.example/libnvidia-container/stable/deb/$(ARCH) /\n",
        "old.list": "# deb http://r.example/cuda/repos/ubuntu2204/x86_64/ /\n",
        "docker.sources": "Types: deb\nURIs: https://download.docker.com/linux/ubuntu\nSuites: noble\n",
        "own.sources": "Types: deb\nURIs: http://r.example/libnvidia-container/stable/deb/amd64/\nSuites: /\n",
    }
    for name, text in files.items():
        (etc / "sources.list.d" / name).write_text(text)
    args = sources_args(cfg)
    assert args["own"] == (CUDA_SOURCE, TOOLKIT_SOURCE)
    args["own"] = (str(etc / "sources.list.d" / "own.sources"),)
    fact = AptSourcesNaming()
    out = subprocess.run(["sh", "-c", fact.command(**args, etc=str(etc))], capture_output=True, text=True, check=True)
    assert fact.process(out.stdout.splitlines())["entries"] == [
        f"{etc / 'sources.list.d' / n}:1" for n in ("cuda-ubuntu2404-x86_64.list", "nvidia-container-toolkit.list")]
    ubuntu = sources_args(cfg.model_copy(update={"nvidia_driver_source": "ubuntu_archive"}))
    assert not any("cuda" in u for u in ubuntu["uris"])  # the CUDA repo is not added: its sources stay


def _apt_dir(tmp_path):
    etc = tmp_path / "apt"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "apt.conf.d").mkdir()
    (etc / "preferences.d").mkdir()
    return etc


DEBIAN = "deb http://deb.debian.org/debian trixie main\ndeb http://security.debian.org/debian-security trixie-security main\n"
CUDA_LINE = "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] http://r.example/cuda/repos/ubuntu2404/x86_64/ /\n"
UBUNTU_SOURCES = ("Types: deb\nURIs: http://archive.ubuntu.com/ubuntu/\nSuites: noble noble-updates\nComponents: main\n"
                  "Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg\n\n"
                  "Types: deb\nURIs: http://r.example/libnvidia-container/stable/deb/amd64/\nSuites: /\n"
                  "Signed-By: /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg\n")


def _indextargets(etc) -> set[str]:
    """What real apt reads from this directory (`apt-get update --print-uris`: no network): each repository's URI."""
    import subprocess

    for d in ("state/lists/partial", "cache/archives/partial"):
        (etc / d).mkdir(parents=True, exist_ok=True)
    out = subprocess.run(["apt-get", "-o", f"Dir::Etc={etc}", "-o", "Dir::Etc::sourcelist=sources.list",
                          "-o", f"Dir::Etc::sourceparts={etc}/sources.list.d", "-o", f"Dir::State={etc}/state",
                          "-o", f"Dir::Cache={etc}/cache", "update", "--print-uris"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    uris = [line.split("'")[1] for line in out.stdout.splitlines() if line.startswith("'") and "InRelease'" in line]
    return {u.split("/dists/")[0] if "/dists/" in u else u.rsplit("/", 1)[0] for u in uris}


def test_only_the_nvidia_entries_are_disabled_never_the_distribution_lines_beside_them(tmp_path):
    """A hand-added CUDA line in sources.list beside Debian's, and a deb822 ubuntu.sources with an NVIDIA stanza
    beside Ubuntu's: the NVIDIA entries go (a `#`, `Enabled: no`), each marked and the first state kept; real apt
    still reads every distribution entry, and no longer the NVIDIA ones. Twice is once."""
    import subprocess

    from deploys.apt_sources import sources_args
    from facts.apt import AptSourcesNaming, nvidia_sources_command

    cfg = NodeConfig.model_validate({**profile("rtx_pro_6000_pair"), "nvidia_repo_url": "http://r.example/cuda/repos",
                                     "nvidia_toolkit_repo_url": "http://r.example/libnvidia-container/stable/deb"})
    etc = _apt_dir(tmp_path)
    (etc / "sources.list").write_text(DEBIAN + CUDA_LINE)
    (etc / "sources.list.d" / "ubuntu.sources").write_text(UBUNTU_SOURCES)
    args = {**sources_args(cfg), "own": ()}
    fact = AptSourcesNaming()

    def found():
        out = subprocess.run(["sh", "-c", fact.command(**args, etc=str(etc))], capture_output=True, text=True,
                             check=True)
        return fact.process(out.stdout.splitlines())

    before = _indextargets(etc)
    assert {"http://r.example/cuda/repos/ubuntu2404/x86_64", "http://deb.debian.org/debian",
            "http://archive.ubuntu.com/ubuntu", "http://r.example/libnvidia-container/stable/deb/amd64"} <= before
    assert found() == {"entries": [f"{etc}/sources.list:3", f"{etc}/sources.list.d/ubuntu.sources:7"], "mixed": []}
    for _ in range(2):
        subprocess.run(["sh", "-c", nvidia_sources_command("disable", args["uris"], args["own"], str(etc))],
                       check=True, capture_output=True)
    assert found() == {"entries": [], "mixed": []}
    after = _indextargets(etc)
    assert after == {u for u in before if "r.example" not in u} and after, (before, after)
    listing = (etc / "sources.list").read_text()
    assert listing.startswith(DEBIAN) and "# inference-nodes: disabled" in listing and CUDA_LINE.strip() in listing
    stanza = (etc / "sources.list.d" / "ubuntu.sources").read_text()
    assert "Enabled: no" in stanza and stanza.count("Enabled: no") == 1
    assert (etc / "sources.list.inference-nodes-orig").read_text() == DEBIAN + CUDA_LINE


def test_a_stanza_mixing_an_nvidia_uri_with_others_is_reported_not_split(tmp_path):
    import subprocess

    from facts.apt import AptSourcesNaming

    etc = _apt_dir(tmp_path)
    (etc / "sources.list").write_text(DEBIAN)
    (etc / "sources.list.d" / "mixed.sources").write_text(
        "Types: deb\nURIs: http://archive.ubuntu.com/ubuntu/ http://r.example/cuda/repos/ubuntu2404/x86_64/\n"
        "Suites: noble\nComponents: main\n")
    fact = AptSourcesNaming()
    cmd = fact.command(uris=("http://r.example/cuda/repos/",), own=(), etc=str(etc))
    out = fact.process(subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, check=True).stdout.splitlines())
    assert out["entries"] == [] and out["mixed"] == [f"{etc}/sources.list.d/mixed.sources: URIs: "
                                                     "http://archive.ubuntu.com/ubuntu/ http://r.example/cuda/repos/ubuntu2404/x86_64/"]

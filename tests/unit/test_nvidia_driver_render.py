"""Files and package sets the driver deploy renders from inventory data."""

import subprocess

from deploys.nvidia_driver import cuda_repo_path, render_apt_pin, render_cuda_source, render_unattended_blacklist
from deploys.schema import NvidiaDriverKeys


def test_pin_gives_the_branch_1001_and_other_branches_minus_one():
    pin = render_apt_pin("580")
    records = [r for r in pin.split("\n\n")]
    assert "Pin: version 580.*\nPin-Priority: 1001" in records[0]
    assert "Pin-Priority: -1" in records[1]


def _matches_other_branch(version: str) -> bool:
    # apt evaluates /regex/ pins as POSIX extended regexes; grep -E is the same dialect
    pattern = render_apt_pin("580").split("Pin: version /")[1].split("/\n")[0]
    return subprocess.run(["grep", "-qE", pattern], input=version, text=True).returncode == 0


def test_minus_one_record_hits_driver_branches_not_the_toolkit():
    for version in ("590.44.01-1", "575.57.08-0ubuntu1", "1:590.44.01-1"):
        assert _matches_other_branch(version), version
    for version in ("1.18.0-1", "1.19.1-1", "13.0.96-1"):
        assert not _matches_other_branch(version), version


def test_default_package_sets_per_source():
    cfg = NvidiaDriverKeys()
    assert cfg.driver_packages == ["nvidia-driver-pinning-580", "nvidia-open"]
    assert NvidiaDriverKeys(nvidia_driver_open=False).driver_packages == ["nvidia-driver-pinning-580", "cuda-drivers"]
    assert NvidiaDriverKeys(nvidia_driver_source="ubuntu_archive").driver_packages == [
        "nvidia-headless-580-server-open", "nvidia-utils-580-server"]
    assert NvidiaDriverKeys(nvidia_driver_source="preinstalled").driver_packages == []


def test_cuda_repo_path_and_source():
    assert cuda_repo_path({"id": "ubuntu", "version_id": "24.04"}, "x86_64") == "ubuntu2404/x86_64"
    assert cuda_repo_path({"id": "ubuntu", "version_id": "24.04"}, "aarch64") == "ubuntu2404/sbsa"
    src = render_cuda_source(NvidiaDriverKeys(), "ubuntu2404/sbsa")
    assert "URIs: https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/sbsa/\nSuites: /\n" in src
    assert "Signed-By: /etc/apt/keyrings/inference-nodes-nvidia-cuda.gpg" in src


def test_unattended_blacklist_adds_the_kernel_only_when_held():
    assert '"linux-";' not in render_unattended_blacklist(NvidiaDriverKeys())
    assert '"linux-";' in render_unattended_blacklist(NvidiaDriverKeys(nvidia_kernel_hold="6.17.0-1031-nvidia"))


def test_an_arm64_cuda_repo_profile_renders_the_sbsa_source():
    from deploys.render import host_files
    from deploys.schema import NodeConfig

    cfg = NodeConfig.model_validate({
        "cluster_name": "x", "node_arch": "aarch64", "gpu_indices": [0], "tensor_parallel_size": 1,
        "model_repo": "a/b", "model_revision": "0" * 40, "model_root": "/m", "image": "registry.example/i", "allow_unpinned_image": True,
        "nvidia_driver_source": "cuda_repo",
    })
    source = host_files(cfg, cfg, 1, [cfg])["/etc/apt/sources.list.d/inference-nodes-nvidia-cuda.sources"]
    assert "URIs: https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/sbsa/\n" in source

"""Fact parsers on real command output, and preflight's refusal rules."""

import json
import os
import subprocess

import pytest
from pyinfra.api.exceptions import FactProcessError

from deploys.preflight import format_table, problems_for, resources_args, row_for
from deploys.schema import NodeConfig
from facts.host import MountSizeBytes, NodeResources
from tests.unit.profiles import profile

# Output of NodeResources' command on a sandbox node (Debian trixie under systemd-nspawn).
SANDBOX_OUTPUT = """os=Debian GNU/Linux 13 (trixie)
arch=x86_64
kernel=6.18.44-fc-v595
cpus=2
mem_bytes=25218297856
disk_path=/mnt
disk_free_bytes=83963756544
model_present_bytes=0
rdma=""".splitlines()


PROFILE_A = profile("rtx_pro_6000_pair")
CFG = NodeConfig.model_validate(PROFILE_A)


def test_node_resources_parses_real_output():
    res = NodeResources().process(SANDBOX_OUTPUT)
    assert res["arch"] == "x86_64" and res["cpus"] == 2 and res["disk_free_bytes"] == 83963756544
    assert res["rdma"] == [] and "podman" not in res


def test_node_resources_lists_rdma():
    out = [line for line in SANDBOX_OUTPUT if not line.startswith("rdma")] + ["rdma=mlx5_0 mlx5_1 "]
    assert NodeResources().process(out)["rdma"] == ["mlx5_0", "mlx5_1"]


def test_node_resources_rejects_garbage_per_host():
    with pytest.raises(FactProcessError):
        NodeResources().process(["arch=x86_64"])
    with pytest.raises(FactProcessError):
        NodeResources().process([line.replace("cpus=2", "cpus=two") for line in SANDBOX_OUTPUT])


def test_node_resources_command_quotes_paths():
    cmd = NodeResources().command(model_root="/mnt/a b", snapshot_dir="/mnt/a b/x;rm -rf /")
    assert "p='/mnt/a b'" in cmd and "'/mnt/a b/x;rm -rf /'" in cmd


def test_mount_size_parses_and_rejects():
    assert MountSizeBytes().process(["17179869184"]) == 16 * 2**30
    with pytest.raises(FactProcessError):
        MountSizeBytes().process(["df: /dev/shm: No such file"])


def _res(**changes):
    return {**NodeResources().process(SANDBOX_OUTPUT), **changes}


def test_fit_host_has_no_problems():
    assert problems_for(CFG, _res(disk_free_bytes=200 * 10**9), 16 * 2**30) == []


def test_arch_aliases_are_accepted_and_mismatch_refused():
    assert problems_for(CFG, _res(arch="amd64", disk_free_bytes=200 * 10**9), 16 * 2**30) == []
    (problem,) = problems_for(CFG, _res(arch="aarch64", disk_free_bytes=200 * 10**9), 16 * 2**30)
    assert "arch is aarch64, the profile needs x86_64" in problem


def test_disk_check_counts_what_is_already_there():
    (problem,) = problems_for(CFG, _res(disk_free_bytes=100 * 10**9), 16 * 2**30)
    assert "too little disk for the model at /mnt/data/hf" in problem and "167000000000 bytes still needed" in problem
    assert problems_for(CFG, _res(disk_free_bytes=100 * 10**9, model_present_bytes=100 * 10**9), 16 * 2**30) == []


def test_shm_too_small_for_kv_offload():
    (problem,) = problems_for(CFG, _res(disk_free_bytes=200 * 10**9), 4 * 2**30)
    assert "/dev/shm is 4.0 GiB; kv_offload_gib 8 + shm_headroom_gib 1 needs 9.0 GiB" in problem


def test_table_has_a_row_per_host_and_aligned_columns():
    table = format_table([row_for("node-a", CFG, _res(), 16 * 2**30, podman="5.4.2"),
                          row_for("node-bb", CFG, _res(), 2**30)])
    lines = table.splitlines()
    assert lines[0].startswith("host ") and "GPUs" in lines[0] and "RDMA" in lines[0]
    assert lines[2].startswith("node-a ") and "16.0 GiB" in lines[2] and "5.4.2" in lines[2]
    assert lines[0].index("OS") == lines[2].index("Debian")


# `ip -o addr show | awk '{print $4}'` on a GB10 node with its ConnectX-7 port up (and on the sandbox machine).
GB10_ADDRESSES = ["127.0.0.1/8", "::1/128", "192.0.2.20/24", "198.51.100.20/24", "fe80::5a02:3ff:fe04:506/64"]


def test_interface_addresses_parse_ip_output():
    from facts.host import InterfaceAddresses

    assert InterfaceAddresses().process(GB10_ADDRESSES + [""]) == GB10_ADDRESSES


def test_preflight_refuses_a_fabric_address_the_node_does_not_have():
    from deploys.preflight import fabric_problem

    b0 = NodeConfig.model_validate({**profile("gb10_dspark"), "node_rank": 0, "fabric_address": "198.51.100.20"})
    assert fabric_problem(b0, GB10_ADDRESSES) is None
    assert fabric_problem(b0, []) is None  # no iproute2: unknown, not refused
    wrong = b0.model_copy(update={"fabric_address": "198.51.100.99"})
    problem = fabric_problem(wrong, GB10_ADDRESSES)
    assert problem.startswith("fabric_address 198.51.100.99 is not an address of this node (it has 127.0.0.1, ")
    # nodes sharing one machine (the sandbox): any address in lo's network is this machine's
    shared = b0.model_copy(update={"fabric_address": "127.0.1.10", "fabric_on_one_host": True})
    assert fabric_problem(shared, GB10_ADDRESSES) is None
    assert fabric_problem(shared.model_copy(update={"fabric_on_one_host": False}), GB10_ADDRESSES) is not None
    assert problem in problems_for(wrong, _res(disk_free_bytes=200 * 10**9), 64 * 2**30, None, GB10_ADDRESSES)


def test_preflight_refuses_a_node_without_the_rdma_devices_the_container_needs():
    from facts.host import ExistingPaths

    b0 = NodeConfig.model_validate({**profile("gb10_dspark"), "node_rank": 0, "fabric_address": "198.51.100.20"})
    assert b0.container_devices == ["/dev/infiniband"]
    res = _res(arch="aarch64", disk_free_bytes=200 * 10**9)
    assert problems_for(b0, res, 0, None, [], ["/dev/infiniband"]) == []
    (problem,) = problems_for(b0, res, 0, None, [], [])
    assert problem.startswith("container_devices /dev/infiniband not on this node (no RDMA NIC")
    assert ExistingPaths().process(["/dev/infiniband", ""]) == ["/dev/infiniband"]
    assert "'/dev/in finiband'" in ExistingPaths().command(("/dev/in finiband",))


def test_container_shm_is_checked_for_what_the_container_gets():
    b0 = NodeConfig.model_validate({**profile("gb10_dspark"), "node_rank": 0, "fabric_address": "198.51.100.20"})
    assert b0.container_shm_bytes == 8 * 2**30  # ShmSize=8g: the host's /dev/shm is not the container's
    res = _res(arch="aarch64", disk_free_bytes=200 * 10**9)
    assert problems_for(b0, res, 64 * 2**20, None, [], ["/dev/infiniband"]) == []
    a = NodeConfig.model_validate(profile("rtx_pro_6000_pair"))
    assert a.container_shm_bytes is None  # --ipc=host: the host's, checked on the node
    unset = NodeConfig.model_validate({**profile("gb10_dspark"), "container_shm_size": None})
    assert (unset.shm_size_rendered, unset.container_shm_bytes) == ("1024m", 2**30)  # not Podman's 64 MiB
    with pytest.raises(Exception, match="at least 1 GiB: the container's /dev/shm"):
        NodeConfig.model_validate({**profile("gb10_dspark"), "container_shm_size": "64m"})


def test_dgx_os_version_is_read_from_dgx_release_and_shown(tmp_path):
    """The fact's own shell on a stand-in /etc/dgx-release (DGX OS carries its version there)."""
    import subprocess

    from facts.host import _NODE_RESOURCES

    release = tmp_path / "dgx-release"
    release.write_text('DGX_NAME="DGX Spark"\nDGX_PRETTY_NAME="NVIDIA DGX Spark"\nDGX_SWBUILD_VERSION="7.2.3"\n'
                       'DGX_OTA_VERSION="7.4.0"\n')
    part = _NODE_RESOURCES.split("\n")
    start = next(i for i, line in enumerate(part) if "dgx-release" in line)
    script = "\n".join(part[start:start + 5]).replace("/etc/dgx-release", str(release))
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["dgx_os=7.4.0"]
    release.write_text('DGX_SWBUILD_VERSION="7.2.3"\n')
    assert subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout.split() == ["dgx_os=7.2.3"]
    res = NodeResources().process(SANDBOX_OUTPUT + ["dgx_os=7.4.0"])
    row = row_for("spark-c0", CFG, res, 16 * 2**30)
    assert row[2] == "Debian GNU/Linux 13 (trixie) (DGX OS 7.4.0)"
    assert NodeResources().process(SANDBOX_OUTPUT)["dgx_os"] is None


def _resources_on(tmp_path, **args) -> dict:
    """NodeResources' real command, run by a real shell against a real directory."""
    proc = subprocess.run(["sh", "-c", NodeResources().command(**args)], capture_output=True, text=True, check=True)
    return NodeResources().process(proc.stdout.splitlines())


def test_a_plain_directory_holding_another_commit_counts_nothing_as_present(tmp_path):
    """The `plain` layout syncs a new commit over the directory that serves, keeping the old files as hard links
    beside (for a rollback): none of the bytes there count towards the new commit, so preflight asks for its full
    size, and refuses, naming the commit held, where the disk cannot hold both."""
    plain = tmp_path / "model"
    (plain / ".inference-nodes-releases" / "old").mkdir(parents=True)
    (plain / "model.safetensors").write_bytes(b"x" * 300_000)
    os.link(plain / "model.safetensors", plain / ".inference-nodes-releases" / "old" / "model.safetensors")
    (plain / ".inference-nodes-releases" / "other.bin").write_bytes(b"y" * 500_000)  # a kept tree's own bytes
    stamp = tmp_path / "stamp.json"
    stamp.write_text('{"bad_verdicts": 0, "commit": "' + "a" * 40 + '", "files": {"model.safetensors": [1, 2, 3]}}')
    args = {"model_root": str(plain), "snapshot_dir": str(plain), "stamp": str(stamp)}
    same = _resources_on(tmp_path, **args, revision="a" * 40)
    assert 300_000 <= same["model_present_bytes"] < 400_000, same  # the kept trees are not the asked commit's bytes
    assert "model_held_commit" not in same
    bumped = _resources_on(tmp_path, **args, revision="b" * 40)
    assert bumped["model_present_bytes"] == 0 and bumped["model_held_commit"] == "a" * 40
    stamp.unlink()  # a first sync killed half way: what is there counts
    assert _resources_on(tmp_path, **args, revision="b" * 40)["model_present_bytes"] >= 300_000

    cfg = CFG.model_copy(update={"model_layout": "plain", "model_root": str(plain), "model_size_gb": 100})
    assert resources_args(cfg)["revision"] == cfg.model_revision and resources_args(cfg)["stamp"].endswith(".json")
    (problem,) = problems_for(cfg, _res(disk_free_bytes=60 * 10**9, model_present_bytes=0,
                                        model_held_commit="a" * 40), 16 * 2**30)
    assert f"100000000000 bytes still needed for commit {cfg.model_revision[:12]}" in problem
    assert "the directory holds commit aaaaaaaaaaaa, kept beside the new one for a rollback" in problem
    assert "revision" not in resources_args(CFG)  # hf_cache: a directory per commit


def test_a_plain_upgrade_needs_room_for_the_changed_files_only(tmp_path):
    """Issue 52 slice 4: the files a new commit shares with the one a `plain` directory holds (same path, size and
    hash in both manifests) are linked, not fetched: preflight asks room for the rest. The live manifest is node
    data: a file it claims at another hash or size, or junk, counts for nothing."""
    from deploys.model.snapshot import unchanged_bytes

    shard = lambda i, h, n: {"path": f"model-0000{i}.safetensors", "size": n, "sha256": h * 64}  # noqa: E731
    new = {"repo": "deepseek-ai/DeepSeek-V4-Flash-0731", "commit": "b" * 40,
           "files": [shard(1, "1", 40 * 10**9), shard(2, "2", 40 * 10**9), shard(3, "3", 20 * 10**9)]}
    (tmp_path / "new.json").write_text(json.dumps(new))
    cfg = CFG.model_copy(update={"model_layout": "plain", "model_root": "/srv/m", "model_size_gb": 100,
                                 "model_manifest": str(tmp_path / "new.json")})
    live = {"commit": "a" * 40, "files": [shard(1, "1", 40 * 10**9), shard(2, "f", 40 * 10**9),
                                          shard(3, "3", 21 * 10**9), "junk"]}
    assert unchanged_bytes(cfg, live) == 40 * 10**9  # shard 2 changed its hash, shard 3 its size
    assert unchanged_bytes(cfg, {}) == 0 and unchanged_bytes(cfg, {"files": "x"}) == 0
    assert unchanged_bytes(cfg.model_copy(update={"model_layout": "hf_cache"}), live) == 0
    held = _res(disk_free_bytes=60 * 10**9 + 1, model_present_bytes=0, model_held_commit="a" * 40)
    assert problems_for(cfg, held, 16 * 2**30, unchanged=40 * 10**9) == []
    (problem,) = problems_for(cfg, {**held, "disk_free_bytes": 59 * 10**9}, 16 * 2**30, unchanged=40 * 10**9)
    assert "60000000000 bytes still needed" in problem and "40000000000 bytes of it unchanged" in problem
    (problem,) = problems_for(cfg, {**held, "model_held_commit": None, "disk_free_bytes": 59 * 10**9}, 16 * 2**30,
                              unchanged=40 * 10**9)  # nothing held: nothing to link from
    assert "100000000000 bytes still needed" in problem

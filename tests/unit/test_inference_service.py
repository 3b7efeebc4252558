"""Quadlet units rendered for the three reference deployments: Podman 4.9.3's key allow-list, the golden
comparison with deployment A's write-up unit, multi-node env, and the RoCE GID lookup."""

import json
import os
import shlex

import pytest

from deploys.service.unit import allowed_container_keys, keys_outside_allow_list, render_cluster, render_service_env, service_env_path, unit_sections
import tempfile

from deploys.inventory import inventory_configs, load_inventory
from deploys.endpoint import render_conf
from deploys.serving_gate import engine_url
from tests.unit.profiles import lab_filled_in
from files.inference_service.roce_gid import find_gid

LAB = inventory_configs(load_inventory(lab_filled_in(tempfile.mkdtemp())))  # C with its gaps set
UNITS = render_cluster(LAB)


def service_env(host: str) -> dict[str, str]:
    """The host's rendered service env file, read as Podman's --env-file reads it (verbatim after the `=`)."""
    from deploys.schema import cluster_of

    cluster = cluster_of(LAB, host)
    text = render_service_env(LAB[host], cluster.head, cluster.size)
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


@pytest.mark.parametrize("host", sorted(UNITS))
def test_every_unit_uses_only_keys_podman_4_9_3_knows(host):
    assert keys_outside_allow_list(UNITS[host]) == []


def test_allow_list_catches_a_5x_key():
    allowed = allowed_container_keys()
    assert "AddDevice" in allowed and "Ulimit" in allowed
    for key in ("Entrypoint", "StopTimeout", "GroupAdd", "Memory", "ServiceName"):
        assert key not in allowed, key
    unit = UNITS["rtx-pro-a.lab.example"].replace("[Container]\n", "[Container]\nStopTimeout=30\n")
    assert keys_outside_allow_list(unit) == ["StopTimeout"]


def test_golden_deployment_a():
    c = dict(unit_sections(UNITS["rtx-pro-a.lab.example"]))
    container = c["Container"]
    values = lambda k: [v for key, v in container if key == k]  # noqa: E731
    assert values("ContainerName") == ["grandpa"]
    assert values("Image") == ["registry.home.arpa/vllm:deepseek-v4@sha256:"
                               "64b94299abdd3bcf5bb5050ca91b378f9ee4e0b0eff4748375b95352371d7cb2"]
    assert values("Pull") == ["never"]  # deliberate: pinned digest, pre-pulled, instead of Pull=always
    assert values("Network") == ["host"]
    assert values("AddDevice") == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    assert values("RunInit") == ["true"]
    assert values("Exec") == ["/usr/local/bin/serve-ds4-flash.sh"]
    assert values("Volume") == [
        "/mnt/data/hf/hub/models--deepseek-ai--DeepSeek-V4-Flash-0731:/models:ro",
        "/mnt/data/hf/jit/ds4-v20-r24:/cache",
        "/mnt/data/hf/tmp/ds4-v20-r24:/container-tmp",
    ]
    # every write-up setting: --ipc=host --privileged, and the three ulimits in one line (4.9.3 keeps
    # only the last Ulimit=), instead of three Ulimit= lines
    assert values("PodmanArgs") == ["--ipc=host --privileged --ulimit memlock=-1:-1 --ulimit nofile=1048576:1048576 "
                                    "--ulimit stack=67108864:67108864"]
    assert values("ShmSize") == [] and values("Ulimit") == []
    assert values("Environment") == [], "no values in the world-readable unit"
    assert values("EnvironmentFile") == ["/etc/inference-nodes/fabric.env",
                                         service_env_path(LAB["rtx-pro-a.lab.example"])]  # the service's last: it wins
    env = service_env("rtx-pro-a.lab.example")
    write_up = {"BACKEND": "b12x-a8", "CUDA_VISIBLE_DEVICES": "0,1", "DCP_SIZE": "1", "DSPARK_DEPTH_MODE": "fixed",
                "DSPARK_TOKENS": "5", "GPU_MEMORY_UTILIZATION": "0.975", "INSTANTTENSOR_BACKEND": "BUFFERED",
                "KV_OFFLOADING_SIZE": "8", "LOAD_FORMAT": "instanttensor", "MAX_MODEL_LEN": "262144",
                "MAX_NUM_BATCHED_TOKENS": "8192", "MAX_NUM_SEQS": "2", "MODE": "dspark",
                "MODEL_PATH": "/models/snapshots/7872f01b1d1fe23eabc4c98b48bffcef5a386062", "PORT": "8000",
                "SERVED_MODEL_NAME": "grandpa", "TP_SIZE": "2"}
    # the write-up's clients reach port 8000 on loopback: now the head's door, with vLLM itself behind it on its own
    assert env["PORT"] == "18000" and LAB["rtx-pro-a.lab.example"].engine_port == 18000
    assert "listen 127.0.0.1:8000;" in render_conf(LAB["rtx-pro-a.lab.example"])
    write_up["PORT"] = "18000"
    assert {k: env.get(k) for k in write_up} == write_up
    service = dict(c["Service"])
    for key, value in {"TimeoutStartSec": "3600", "TimeoutStopSec": "120", "Restart": "always",
                       "RestartSec": "30", "RestartSteps": "5", "RestartMaxDelaySec": "300", "LimitMEMLOCK": "infinity", "LimitNOFILE": "1048576",
                       "LimitSTACK": "67108864"}.items():
        assert service[key] == value, key
    pre = [v for k, v in c["Service"] if k == "ExecStartPre"]
    assert pre[0] == "/usr/local/bin/inference-nodes-model-gate"  # deliberate: the verify gate first
    assert pre[1] == "/usr/bin/mkdir -p /mnt/data/hf/jit/ds4-v20-r24 /mnt/data/hf/tmp/ds4-v20-r24"
    assert pre[-1].startswith('/bin/sh -c "mkdir -p /run/inference-nodes && { cat /etc/containers/systemd/grandpa.container')
    assert "sha256sum < /var/lib/inference-nodes/model-verified.json" in pre[-1]  # the snapshot it starts from
    assert values("Exec") == ["/usr/local/bin/serve-ds4-flash.sh"]  # the image's script builds vLLM's arguments
    assert dict(c["Unit"])["Wants"] == "network-online.target"


def test_two_node_units_carry_the_whole_launch_contract():
    head = dict(unit_sections(UNITS["gb10-b0.lab.example"]))
    worker = dict(unit_sections(UNITS["gb10-b1.lab.example"]))
    env = lambda u: service_env("gb10-b0.lab.example" if u is head else "gb10-b1.lab.example")  # noqa: E731
    argv = lambda u: shlex.split(dict(u["Container"])["Exec"])  # noqa: E731
    common = ["vllm", "serve", "/models", "--served-model-name", "deepseek-v4-flash-0731", "--tensor-parallel-size", "2",
              "--nnodes", "2"]
    assert argv(head)[:len(common)] == common and argv(worker)[:len(common)] == common
    assert argv(head)[len(common):len(common) + 10] == ["--node-rank", "0", "--master-addr", "198.51.100.20",
                                                        "--master-port", "29500", "--host", "127.0.0.1", "--port", "18000"]
    assert argv(worker)[len(common):len(common) + 7] == ["--node-rank", "1", "--master-addr", "198.51.100.20",
                                                         "--master-port", "29500", "--headless"]
    assert "--host" not in argv(worker) and "--port" not in argv(worker), "workers serve no API"
    assert "--headless" not in argv(head)
    assert argv(head)[-15:-13] == ["--kv-cache-dtype", "nvfp4_ds_mla"]  # the profile's flags follow the derived ones
    for unit in (head, worker):  # vLLM reads none of these; its own flags carry rank and head
        assert not {"NODE_RANK", "NNODES", "MASTER_ADDR", "HEADLESS", "MODEL_PATH"} & set(env(unit))
    assert env(worker)["VLLM_HOST_IP"] == "198.51.100.21" and env(head)["VLLM_HOST_IP"] == "198.51.100.20"
    assert env(head)["VLLM_CACHE_ROOT"] == "/cache/vllm"
    assert "NCCL_IB_GID_INDEX" not in env(worker), "read from sysfs at start, never copied"
    assert ("ExecStartPre", "/usr/local/bin/inference-nodes-roce-gid /run/inference-nodes/roce.env 198.51.100.21") \
        in worker["Service"]
    assert ("EnvironmentFile", "/etc/inference-nodes/fabric.env") in head["Container"]
    health = dict(worker["Container"])
    assert health["HealthCmd"] == "python3 /run/inference-nodes-job-probe.py --port 29500 --role worker"
    assert health["HealthOnFailure"] == "kill" and health["HealthStartPeriod"] == "120s"
    assert dict(head["Container"])["HealthCmd"] == \
        "python3 /run/inference-nodes-job-probe.py --port 29500 --role head --nodes 2"
    assert ("Volume", "/usr/local/lib/inference-nodes/job_probe.py:/run/inference-nodes-job-probe.py:ro") \
        in head["Container"]


def test_job_probe_counts_only_established_connections_of_its_own_processes():
    import socket

    from files.inference_service.job_probe import established, own_socket_inodes

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert established(port, "local", own_socket_inodes()) == 0
        with socket.create_connection(("127.0.0.1", port)) as client, server.accept()[0]:
            mine = own_socket_inodes()
            assert established(port, "local", mine) == 1   # the head's side: accepted from the job
            assert established(port, "remote", mine) == 1  # a worker's side: its connection to the head
            assert established(port, "remote", set()) == 0  # other containers' sockets do not count
            client.close()


def test_deployment_c_renders_its_served_name_and_rank_flags():
    c0 = shlex.split(dict(dict(unit_sections(UNITS["spark-c0.lab.example"]))["Container"])["Exec"])
    assert c0[:8] == ["vllm", "serve", "/models", "--served-model-name", "deepseek-v4-flash-0731",
                      "--tensor-parallel-size", "2", "--nnodes"]
    assert "--master-addr" in c0 and c0[c0.index("--master-addr") + 1] == "198.51.100.30"


def test_hostile_values_stay_one_argument_and_one_variable():
    from deploys.unit_text import UnitValueError, command_line, environment_line, unit_word

    assert unit_word("plain-1.0") == "plain-1.0"
    assert unit_word('a "b" c') == '"a \\"b\\" c"'
    assert unit_word("50%") == '"50%%"' and unit_word("$HOME") == '"$$HOME"'
    assert unit_word("C:\\x") == '"C:\\\\x"'
    assert environment_line("MODE", 'x" "LD_PRELOAD=/tmp/evil.so') == \
        'Environment="MODE=x\\" \\"LD_PRELOAD=/tmp/evil.so"\n'
    assert command_line(["--x", "a b"]) == '--x "a b"'
    # C0, DEL, C1 (NEL), zero-width, bidi override, line separator: the same set the schema refuses
    for bad in ("a\nExecStartPre=/bin/evil", "tab\there", "nul\0", "del\x7f", "nel\x85", "zw\u200bsp",
                "bidi\u202e", "ls\u2028"):
        with pytest.raises(UnitValueError):
            unit_word(bad)



def test_env_file_lines_are_verbatim_or_refused():
    from deploys.unit_text import UnitValueError, env_file_line

    assert env_file_line("NCCL_IB_HCA", '=mlx5_0:1 "x" $Y\\') == 'NCCL_IB_HCA==mlx5_0:1 "x" $Y\\\n'
    for name, value in (("NCCL_X", "a\nLD_PRELOAD=/x.so"), ("BAD NAME", "1"), ("NCCL_X", "a\rb")):
        with pytest.raises(UnitValueError):
            env_file_line(name, value)


def _gid_tree(root, dev, entries):
    for port, index, gid_type, gid in entries:
        base = os.path.join(root, "class", "infiniband", dev, "ports", str(port))
        os.makedirs(os.path.join(base, "gids"), exist_ok=True)
        os.makedirs(os.path.join(base, "gid_attrs", "types"), exist_ok=True)
        with open(os.path.join(base, "gids", str(index)), "w") as f:
            f.write(gid + "\n")
        with open(os.path.join(base, "gid_attrs", "types", str(index)), "w") as f:
            f.write(gid_type + "\n")


def test_roce_gid_picks_the_v2_gid_of_the_fabric_address(tmp_path):
    _gid_tree(str(tmp_path), "mlx5_0", [
        (1, 0, "IB/RoCE v1", "fe80:0000:0000:0000:0000:0000:0000:0001"),
        (1, 1, "RoCE v2", "fe80:0000:0000:0000:0000:0000:0000:0001"),
        (1, 2, "IB/RoCE v1", "0000:0000:0000:0000:0000:ffff:c633:6414"),
        (1, 3, "RoCE v2", "0000:0000:0000:0000:0000:ffff:c633:6414"),  # 198.51.100.20
    ])
    assert find_gid(str(tmp_path), "198.51.100.20") == ("mlx5_0", "1", 3)
    assert find_gid(str(tmp_path), "198.51.100.21") is None


def test_a_change_on_one_node_of_a_pair_changes_both_units():
    from deploys.service.unit import render_container
    from deploys.schema import cluster_head, clusters

    members = clusters(LAB)["gb10-dspark"]
    cfgs = [c for _, c in members]
    changed = [cfgs[0], cfgs[1].model_copy(update={"service_env": {"X": "1"}})]
    head = cluster_head(members)
    before = [render_container(c, head, 2, cfgs) for c in cfgs]
    after = [render_container(c, head, 2, changed) for c in cfgs]
    assert before[0] != after[0], "the head's unit must change with its worker's launch"
    assert UNITS["rtx-pro-a.lab.example"].count("cluster launch") == 0


def test_head_probe_fails_once_a_connection_of_the_formed_job_is_replaced(tmp_path, monkeypatch):
    import socket

    from files.inference_service import job_probe

    monkeypatch.setattr(job_probe, "JOB_FILE", str(tmp_path / "peers"))
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        args = ["--port", str(port), "--role", "head", "--nodes", "1"]
        assert job_probe.main(args) == 1  # nobody connected yet
        first = socket.create_connection(("127.0.0.1", port))
        a, _ = server.accept()
        assert job_probe.main(args) == 0 and job_probe.main(args) == 0  # the job formed, and stays whole
        second = socket.create_connection(("127.0.0.1", port))  # a restarted worker connects anew...
        b, _ = server.accept()
        first.close()
        a.close()
        assert job_probe.main(args) == 1  # ...but the job it belonged to is gone
        for s in (second, b):
            s.close()


def test_speculative_decoding_is_profile_data_rendered_as_vllm_takes_it():
    """B (DSpark K5) and C (DeepSeek MTP) carry speculative decoding as a typed key, rendered as the JSON
    vLLM's --speculative-config takes; B's MoE backend is upstream's flag with the fork's value."""
    import json

    b0 = shlex.split(dict(unit_sections(UNITS["gb10-b0.lab.example"])["Container"])["Exec"])
    spec = json.loads(b0[b0.index("--speculative-config") + 1])
    assert spec == {"method": "dspark", "num_speculative_tokens": 5}
    assert b0[b0.index("--moe-backend") + 1] == "flashinfer_b12x"
    assert b0[b0.index("--kv-cache-dtype") + 1] == "nvfp4_ds_mla"
    c1 = shlex.split(dict(unit_sections(UNITS["spark-c1.lab.example"])["Container"])["Exec"])
    assert json.loads(c1[c1.index("--speculative-config") + 1]) == {"method": "mtp", "num_speculative_tokens": 1}
    assert "--headless" in c1


def test_fabric_profiles_pass_rdma_devices_and_a_shm_of_their_own():
    for host in ("gb10-b0.lab.example", "spark-c1.lab.example"):
        container = unit_sections(UNITS[host])["Container"]
        assert ("AddDevice", "/dev/infiniband") in container
        assert ("ShmSize", "8g") in container
        assert "--ipc=host" not in dict(container)["PodmanArgs"]
    a = unit_sections(UNITS["rtx-pro-a.lab.example"])["Container"]
    assert "ShmSize" not in dict(a) and "--ipc=host" in dict(a)["PodmanArgs"]
    assert ("AddDevice", "/dev/infiniband") not in a


def test_the_last_good_release_is_kept_whole_and_put_back_by_the_shell_commands(tmp_path, monkeypatch):
    """save_good_command / restore_good_command run by a real shell on files under tmp_path (systemctl a stub that
    logs, the project's verifier for the model links): the release's files come back byte for byte with their
    modes, the env file never readable by others on the way, the Quadlet follow-up stamp records the restored unit,
    the `plain` layout's model comes back as the very files (inodes) that passed, the history lists each release
    once, and a second save replaces the first whole."""
    import stat
    import subprocess

    from deploys.service import release as svc
    from deploys.ops import content_fingerprint
    from deploys.schema import NodeConfig
    from files import helper_path
    from tests.unit.profiles import profile

    root = tmp_path / "node"
    paths = {"UNIT_DIR": root / "units", "MANIFEST": root / "m.json", "STAMP": root / "stamp.json",
             "RECORD": root / "record.json", "GATE": root / "gate", "RELEASES_DIR": root / "releases"}
    for name, path in paths.items():
        monkeypatch.setattr(svc, name, str(path))
    monkeypatch.setattr(svc, "VERIFIER", helper_path("model_snapshot/verify_snapshot.py"))
    monkeypatch.setattr(svc, "PRUNER", helper_path("model_snapshot/snapshot_releases.py"))
    env_path = root / "svc.env"
    monkeypatch.setattr(svc, "service_env_path", lambda cfg: str(env_path))
    monkeypatch.setattr(svc, "follow_up_stamp", lambda name: str(root / "follow-ups" / name))
    model = tmp_path / "model"
    cfg = NodeConfig.model_validate({**profile("gb10_dspark"), "node_rank": 0, "fabric_address": "198.51.100.20",
                                     "tensor_parallel_size": 1})
    # validation keeps these paths out of /tmp; a test may not
    cfg = cfg.model_copy(update={"model_root": str(model), "fabric_env_file": str(root / "fabric.env")})
    monkeypatch.setattr(svc.model_integrity, "UNIT_DIR", str(root / "systemd"))
    (root / "systemd").mkdir(parents=True)
    assert cfg.model_layout == "plain"
    files = svc.release_files(cfg)
    assert [n for n, _, _ in files] == ["unit.container", "service.env", "fabric.env", "model-manifest.json",
                                        "model-verified.json", "model-deep-verify.json", "model-gate",
                                        "model-verify.service"]  # plain layout: no refs/main
    assert all(path.startswith(str(root)) for _, path, _ in files)
    (root / "units").mkdir(parents=True)

    def commit(tag: str, names: list[str]) -> str:
        """A model commit in the plain directory, as a sync leaves it (files replaced by rename, extras gone)."""
        model.mkdir(exist_ok=True)
        for p in model.iterdir():
            if p.is_file():
                p.unlink()
        entries = []
        for name in names:
            (model / f"{name}.tmp").write_text(f"{tag} {name}\n")
            os.replace(model / f"{name}.tmp", model / name)
            entries.append({"path": name, "size": (model / name).stat().st_size, "sha256": "0" * 64})
        revision = (tag * 40)[:40]
        (root / "m.json").write_text(json.dumps({"repo": "org/m", "commit": revision, "files": entries}))
        return revision

    good_rev = commit("a", ["config.json", "w-1.safetensors", "w-2.safetensors"])
    good_inodes = {p.name: p.stat().st_ino for p in model.iterdir()}
    for name, path, mode in files:
        if path != str(root / "m.json"):
            with open(path, "w") as f:
                f.write(f"good {name}\n")
        os.chmod(path, int(mode, 8))
    good_manifest = (root / "m.json").read_text()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/systemctl.log\n")
    (bin_dir / "systemctl").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def sh(command):
        return subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env, timeout=60)

    saved = sh(svc.save_good_command(cfg, {"release": "r1", "model_revision": good_rev, "passed_at": "t1"}))
    assert saved.returncode == 0, saved.stderr
    good = root / "releases" / cfg.container_name / "good"
    assert json.loads((good / "release.json").read_text())["release"] == "r1"
    previous = root / "releases" / cfg.container_name / "previous"
    assert not previous.exists()  # the first release has none before it
    assert stat.S_IMODE(good.stat().st_mode) == 0o700 and stat.S_IMODE((good / "service.env").stat().st_mode) == 0o600
    tree = model / ".inference-nodes-releases" / good_rev
    assert {p.name: p.stat().st_ino for p in tree.iterdir()} == good_inodes  # hard links: no bytes copied
    commit("b", ["config.json", "w-1.safetensors", "new.bin"])  # the new release, synced over the plain directory
    for name, path, mode in files:
        if path != str(root / "m.json"):
            with open(path, "w") as f:
                f.write(f"bad {name}\n")
    assert (tree / "w-1.safetensors").read_text() == "a w-1.safetensors\n"  # the kept commit is untouched
    restored = sh(svc.restore_good_command(cfg, {"release": "r1", "model_revision": good_rev}))
    assert restored.returncode == 0, restored.stderr
    for name, path, mode in files:
        want = good_manifest if path == str(root / "m.json") else f"good {name}\n"
        assert open(path).read() == want and stat.S_IMODE(os.stat(path).st_mode) == int(mode, 8), name
    assert {p.name: p.stat().st_ino for p in model.iterdir() if p.is_file()} == good_inodes
    unit = files[0][1]
    assert open(root / "follow-ups" / svc.QUADLET_STAMP).read().strip() == content_fingerprint(open(unit).read())
    assert open(tmp_path / "systemctl.log").read().split("\n")[:2] == ["daemon-reload", f"restart {cfg.container_name}.service"]
    assert not list(root.rglob("*.rollback")) and not list((root / "releases").rglob("good.*"))
    for release in ("r2", "r1", "r1"):  # (r1 passing again, after a restart: r2 stays the one before it)
        assert sh(svc.save_good_command(cfg, {"release": release, "model_revision": good_rev})).returncode == 0
    assert json.loads((good / "release.json").read_text())["release"] == "r1"
    assert json.loads((previous / "release.json").read_text())["release"] == "r2"
    assert stat.S_IMODE(previous.stat().st_mode) == 0o700 and (previous / "unit.container").read_text() == "good unit.container\n"
    assert not list((root / "releases").rglob("previous.*"))
    (root / "units" / f"{cfg.container_name}.container").write_text("r1's unit\n")
    assert sh(svc.restore_good_command(cfg, {"release": "r2", "model_revision": good_rev}, str(previous))).returncode == 0
    assert (root / "units" / f"{cfg.container_name}.container").read_text() == "good unit.container\n"
    history = json.loads(open(svc.release_history_path(cfg)).read())
    assert [r["release"] for r in history] == ["r2", "r1"] and set(history[0]) == set(svc.HISTORY_KEYS)


def test_images_pruned_are_of_the_repository_unkept_and_unused():
    from files.model_snapshot.snapshot_releases import image_repository, images_to_prune

    assert image_repository("reg:5000/org/vllm:v1@sha256:aa") == "reg:5000/org/vllm"
    assert image_repository("reg:5000/org/vllm") == "reg:5000/org/vllm"
    images = [
        {"Id": "kept", "Digest": "sha256:platform", "RepoDigests": ["reg:5000/org/vllm@sha256:index"]},
        {"Id": "old", "Digest": "sha256:old", "RepoDigests": ["reg:5000/org/vllm@sha256:old"]},
        {"Id": "in-use", "Digest": "sha256:x", "RepoDigests": ["reg:5000/org/vllm@sha256:x"]},
        {"Id": "other-repo", "Digest": "sha256:y", "RepoDigests": ["reg:5000/org/other@sha256:y"]},
        {"Id": "prev", "Digest": "sha256:prev", "RepoDigests": ["reg:5000/org/vllm@sha256:prev"]},
        {"Id": "also-tagged", "Digest": "sha256:z", "RepoDigests": ["reg:5000/org/vllm@sha256:z"],
         "RepoTags": ["reg:5000/org/other:v2"]},
    ]
    keep = ["reg:5000/org/vllm@sha256:prev", "reg:5000/org/vllm@sha256:index"]  # an index digest is kept by its repo digest
    assert images_to_prune(images, ["in-use"], keep) == ["old"]
    assert images_to_prune(images, [], ["reg:5000/org/vllm:v1"]) == []  # a tag names no digest: nothing provably unused


def test_pruning_keeps_the_newest_commits_and_every_blob_they_link_to(tmp_path, monkeypatch, capsys):
    """The pruner on a real hf_cache tree and a plain one: commits beyond the newest kept releases go, the commit
    asked for stays, and a blob shared with a kept snapshot survives. Images (podman a stub that answers and logs)
    are looked at once per release that passed: the unkept one is removed, and the next run reads none."""
    from files.model_snapshot.snapshot_releases import main

    cache = tmp_path / "models--org--m"
    revs = [c * 40 for c in "abc"]
    (cache / "blobs").mkdir(parents=True)
    for blob in ("shared", "only-a", "only-c", "stray"):
        (cache / "blobs" / blob).write_text(blob)
    for rev, blobs in zip(revs, (["shared", "only-a"], ["shared"], ["shared", "only-c"])):
        (cache / "snapshots" / rev).mkdir(parents=True)
        for blob in blobs:
            os.symlink(f"../../blobs/{blob}", cache / "snapshots" / rev / f"{blob}.safetensors")
    history = tmp_path / "history.json"
    history.write_text(json.dumps([{"release": r, "model_revision": rev, "image": f"reg/vllm@sha256:{r}"}
                                   for r, rev in zip("123", revs)]))

    def prune(root, layout, kept, keep, *more):
        capsys.readouterr()
        assert main([str(root), "--layout", layout, "--history", str(history), "--kept", str(kept), "--keep", keep,
                     *more]) == 0
        return json.loads(capsys.readouterr().out)

    assert prune(cache, "hf_cache", 1, revs[1], "--plan")["paths"]
    assert sorted(os.listdir(cache / "snapshots")) == revs  # --plan deletes nothing
    prune(cache, "hf_cache", 1, revs[1])
    assert sorted(os.listdir(cache / "snapshots")) == revs[1:]
    assert sorted(os.listdir(cache / "blobs")) == ["only-c", "shared"]
    plain = tmp_path / "plain"
    for rev in revs:
        (plain / ".inference-nodes-releases" / rev).mkdir(parents=True)
    (plain / ".inference-nodes-releases" / "not-a-commit").mkdir()
    prune(plain, "plain", 2, revs[0])
    assert sorted(os.listdir(plain / ".inference-nodes-releases")) == sorted([*revs, "not-a-commit"])
    prune(plain, "plain", 1, revs[2])
    assert sorted(os.listdir(plain / ".inference-nodes-releases")) == [revs[2], "not-a-commit"]
    bin_dir, log = tmp_path / "bin", tmp_path / "podman.log"
    bin_dir.mkdir()
    inspect = json.dumps([{"Id": i, "Digest": f"sha256:{i}", "RepoDigests": [f"reg/vllm@sha256:{i}"]} for i in "123"])
    (bin_dir / "podman").write_text(
        f"#!/bin/sh\necho \"$@\" >> {log}\ncase \"$1\" in\n  images) printf '1\\n2\\n3\\n' ;;\n"
        f"  image) echo '{inspect}' ;;\n  ps) echo 1 ;;\nesac\n")
    (bin_dir / "podman").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    (tmp_path / "history.json.pruned").unlink()  # the runs above pruned for release 3: as if it had just passed
    assert prune(plain, "plain", 2, revs[2], "--image", "reg/vllm@sha256:3", "--plan")["images"] == []  # 1 in use, 2 kept
    assert prune(plain, "plain", 1, revs[2], "--image", "reg/vllm@sha256:3")["images"] == ["2"]
    assert "rmi 2" in log.read_text()
    log.unlink()
    assert prune(plain, "plain", 1, revs[2], "--image", "reg/vllm@sha256:3", "--plan") == {
        "history": 3, "paths": [], "images": [], "recorded": True}
    assert not log.exists(), "once pruned for the newest release, no podman command runs"


def test_a_cluster_changes_only_with_every_member_here():
    from types import SimpleNamespace

    from deploys.ops import cluster_all_here

    said = []

    class Host:  # what the check reads of a pyinfra Host: its name, and its way of saying why it failed
        def __init__(self, name):
            self.name = name

        def log_styled(self, message, **kwargs):
            said.append(message)

    hosts = {n: Host(n) for n in ("b0", "b1", "b2")}
    state = SimpleNamespace(inventory=SimpleNamespace(get_host=hosts.__getitem__), failed_hosts=set(),
                            active_hosts=set(hosts.values()))
    assert cluster_all_here(state, hosts["b0"], "pair", ["b0", "b1", "b2"]) is True and not said
    state.failed_hosts, state.active_hosts = {hosts["b1"]}, {hosts["b0"]}
    assert cluster_all_here(state, hosts["b0"], "pair", ["b0", "b1", "b2"]) is False
    assert said == ["b0: the launch of cluster pair changes, but b1 failed earlier in this run and b2 is not in this run "
                    "(--limit, or unreachable): no member's unit or model changes, and the cluster keeps serving its "
                    "current launch. Converge the whole cluster once every member can take the change"]
    said.clear()
    assert cluster_all_here(state, hosts["b0"], "pair", ["b0", "b1"], " (model commit a -> b)") is False
    assert said[0].startswith("b0: the launch of cluster pair changes (model commit a -> b), but b1 failed earlier")


def test_cuda_sees_the_cdi_devices_numbered_from_zero():
    """`gpu_indices = [2, 3]` (half of a host split between two services): CDI passes those two devices and CUDA
    numbers them 0 and 1 inside; a `--privileged` container sees every GPU, so host indices in nvidia-smi's order."""
    from deploys.service.unit import render_container, service_environment

    a = LAB["rtx-pro-a.lab.example"]
    half = a.model_copy(update={"gpu_indices": [2, 3], "container_privileged": False})
    env = service_environment(half, None, 1)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and "CUDA_DEVICE_ORDER" not in env
    assert [line for line in render_container(half, None, 1).splitlines() if line.startswith("AddDevice=nvidia")] == \
        ["AddDevice=nvidia.com/gpu=2", "AddDevice=nvidia.com/gpu=3"]
    privileged = service_environment(half.model_copy(update={"container_privileged": True}), None, 1)
    assert privileged["CUDA_VISIBLE_DEVICES"] == "2,3" and privileged["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_the_argument_check_runs_with_least_privilege_unless_the_inventory_says_so():
    from deploys.service.launch_check import args_check_command
    from deploys.service.unit import vllm_argv

    b0 = LAB["gb10-b0.lab.example"]
    argv = shlex.split(args_check_command(b0, vllm_argv(b0, b0, 2)).split(" || ")[0])
    assert {"--network=none", "--cap-drop=all", "--security-opt=no-new-privileges"} <= set(argv)
    nested = b0.model_copy(update={"vllm_args_check_network": "host"})  # the sandbox's nodes are containers
    assert "--network=host" in args_check_command(nested, vllm_argv(nested, nested, 2))


def test_a_rollback_is_gated_where_the_restored_release_listens_and_by_its_name():
    """A failed release that moved the API's port or renamed the model: the release a rollback restores is gated
    with the port, address and name recorded with it; a release kept before they were recorded, as now."""
    from deploys.service.release import as_released, release_of

    cfg = LAB["rtx-pro-a.lab.example"]
    good = release_of(cfg, "f" * 64)
    assert (good["api_bind_address"], good["api_port"], good["engine_port"], good["served_model_name"]) == (
        "127.0.0.1", 8000, 18000, "grandpa")
    failed = cfg.model_copy(update={"api_port": 8104, "engine_port": 18104, "served_model_name": "renamed"})
    back, model = as_released(failed, "renamed", good)
    assert (back.api_bind_address, back.api_port, back.engine_port, model) == ("127.0.0.1", 8000, 18000, "grandpa")
    assert back.has_door
    old = {k: v for k, v in good.items() if k not in ("api_bind_address", "api_port", "engine_port", "served_model_name")}
    back, model = as_released(failed, "renamed", old)
    assert (back.api_port, back.engine_port, model) == (8104, 18104, "renamed")
    # a release from before the door: its vLLM listened on the clients' port itself, and is gated and drained there
    before_door = {k: v for k, v in good.items() if k != "engine_port"}
    back, _ = as_released(failed, "renamed", before_door)
    assert (back.api_port, back.engine_port, back.has_door) == (8000, 8000, False)
    assert engine_url(back) == "http://127.0.0.1:8000" and "listen 127.0.0.1:8000" not in render_conf(back)


def test_the_switch_marker_is_json_with_its_bound_from_the_nodes_clock(tmp_path):
    import subprocess
    import time

    from deploys.service.door import switch_marker_command, switch_marker_path

    cfg = LAB["rtx-pro-a.lab.example"]
    path = switch_marker_path(cfg)
    command = switch_marker_command(cfg).replace(path, str(tmp_path / "m.json")).replace(
        "mkdir -p /var/lib/inference-nodes", f"mkdir -p {tmp_path}")
    subprocess.run(["sh", "-c", command], check=True)
    until = json.loads((tmp_path / "m.json").read_text())["until"]
    assert abs(until - (time.time() + cfg.service_switch_lease_s)) < 5  # a lease, renewed while the converge waits
    longer = switch_marker_command(cfg, 120).replace(path, str(tmp_path / "m.json")).replace(
        "mkdir -p /var/lib/inference-nodes", f"mkdir -p {tmp_path}")
    subprocess.run(["sh", "-c", longer], check=True)  # a drain ahead, which cannot renew it while it runs
    until = json.loads((tmp_path / "m.json").read_text())["until"]
    assert abs(until - (time.time() + cfg.service_switch_lease_s + 120)) < 5


@pytest.mark.parametrize("answers, bound, said", [
    ([(0, 0)], 5, ("0", 1)),  # nothing held: done after the grace
    ([(1, 0), (0, 1), (0, 1), (0, 0)], 10, ("0", 4)),  # a waiting request counts as much as a running one
    (["fail", "fail", (0, 0)], 10, ("0", 3)),  # a failed read is no zero: read again
    (["fail"], 3, ("?", 3)),  # never read: unknown at the bound
    ([(2, 0)], 3, ("2", 3)),  # still held at the bound
])
def test_the_drain_counts_running_and_waiting_requests_and_a_failed_read_is_unknown(answers, bound, said):
    """N2/M1: the drain waits for vLLM's running *and* waiting requests, from a short grace after the door closed;
    a /metrics read that fails is read again, and reported as unknown (`?`) when none succeeded by the bound."""
    import subprocess

    from deploys.service.door import DRAIN
    from tests.unit.local_http import serving

    queue = list(answers)

    def metrics() -> str | None:
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        if answer == "fail":
            return None
        running, waiting = answer
        return ("# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{model_name="m"}} {running}.0\n'
                f'vllm:num_requests_waiting{{model_name="m"}} {waiting}.0\n')

    with serving(metrics) as port:
        out = subprocess.run(["python3", "-c", DRAIN, f"http://127.0.0.1:{port}/metrics", str(bound)],
                             capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert out[0] == said[0] and abs(int(out[1]) - said[1]) <= 1, out

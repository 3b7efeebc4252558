"""Quadlet units rendered for the three reference deployments: Podman 4.9.3's key allow-list, the golden
comparison with deployment A's write-up unit, multi-node env, and the RoCE GID lookup."""

import os

import pytest

from deploys.inference_service import (
    allowed_container_keys,
    keys_outside_allow_list,
    render_cluster,
    unit_sections,
)
from deploys.inventory import inventory_configs, load_inventory
from files.inference_service.roce_gid import find_gid

LAB = inventory_configs(load_inventory("inventories/lab.py"))
UNITS = render_cluster(LAB)


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
    env = dict(v.split("=", 1) for v in values("Environment"))
    write_up = {"BACKEND": "b12x-a8", "CUDA_VISIBLE_DEVICES": "0,1", "DCP_SIZE": "1", "DSPARK_DEPTH_MODE": "fixed",
                "DSPARK_TOKENS": "5", "GPU_MEMORY_UTILIZATION": "0.975", "INSTANTTENSOR_BACKEND": "BUFFERED",
                "KV_OFFLOADING_SIZE": "8", "LOAD_FORMAT": "instanttensor", "MAX_MODEL_LEN": "262144",
                "MAX_NUM_BATCHED_TOKENS": "8192", "MAX_NUM_SEQS": "2", "MODE": "dspark",
                "MODEL_PATH": "/models/snapshots/7872f01b1d1fe23eabc4c98b48bffcef5a386062", "PORT": "8000",
                "SERVED_MODEL_NAME": "grandpa", "TP_SIZE": "2"}
    assert {k: env.get(k) for k in write_up} == write_up
    service = dict(c["Service"])
    for key, value in {"TimeoutStartSec": "3600", "TimeoutStopSec": "120", "Restart": "on-failure",
                       "RestartSec": "30", "LimitMEMLOCK": "infinity", "LimitNOFILE": "1048576",
                       "LimitSTACK": "67108864"}.items():
        assert service[key] == value, key
    pre = [v for k, v in c["Service"] if k == "ExecStartPre"]
    assert pre[0] == "/usr/local/bin/inference-nodes-model-gate"  # deliberate: the verify gate first
    assert pre[-1] == "/usr/bin/mkdir -p /mnt/data/hf/jit/ds4-v20-r24 /mnt/data/hf/tmp/ds4-v20-r24"
    assert dict(c["Unit"])["Wants"] == "network-online.target"


def test_two_node_units_worker_and_head():
    head = dict(unit_sections(UNITS["gb10-b0.lab.example"]))
    worker = dict(unit_sections(UNITS["gb10-b1.lab.example"]))
    env = lambda u: dict(v.split("=", 1) for k, v in u["Container"] if k == "Environment")  # noqa: E731
    assert env(head)["NODE_RANK"] == "0" and "HEADLESS" not in env(head)
    assert env(worker)["NODE_RANK"] == "1" and env(worker)["HEADLESS"] == "1"
    assert env(head)["MASTER_ADDR"] == env(worker)["MASTER_ADDR"] == "198.51.100.20"
    assert env(worker)["VLLM_HOST_IP"] == "198.51.100.21"
    assert "NCCL_IB_GID_INDEX" not in env(worker), "read from sysfs at start, never copied"
    assert ("ExecStartPre", "/usr/local/bin/inference-nodes-roce-gid /run/inference-nodes/roce.env 198.51.100.21") \
        in worker["Service"]
    exec_ = dict(head["Container"])["Exec"]
    assert "--host 127.0.0.1 --port 8000" in exec_ and "--kv-cache-dtype nvfp4_ds_mla" in exec_
    assert ("EnvironmentFile", "/etc/inference-nodes/fabric.env") in head["Container"]


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

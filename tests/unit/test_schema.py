"""The typed inventory: the reference inventories validate; bad input names host, key, value."""

from __future__ import annotations

import copy

import pytest

from deploys.inventory import load_inventory
from deploys.schema import InventoryValidationError, validate_hosts, validate_inventory
from tests.unit.profiles import lab_filled_in, profile

PROFILE_A = profile("rtx_pro_6000_pair")
PROFILE_B = profile("gb10_dspark")


def node_a(**changes):
    data = copy.deepcopy(PROFILE_A)
    data.update(ssh_hostname="192.0.2.10", _sudo=True)
    for key, value in changes.items():
        if value is DELETE:
            data.pop(key)
        else:
            data[key] = value
    return {"node-a": data}


def pair_b(b0: dict, b1: dict):
    out = {}
    for name, extra in (("node-b0", b0), ("node-b1", b1)):
        data = copy.deepcopy(PROFILE_B)
        data.update(extra)
        out[name] = data
    return out


DELETE = object()
HEAD = {"node_rank": 0, "fabric_address": "198.51.100.20"}
WORKER = {"node_rank": 1, "fabric_address": "198.51.100.21"}


def test_lab_inventory_is_valid_and_has_the_three_reference_groups(tmp_path):
    inv = load_inventory(lab_filled_in(tmp_path))  # C's profile gaps set (tests/unit/test_profile_gaps.py)
    configs = validate_inventory(inv)
    groups = {g: [h.name for h in inv.get_group(g)] for g in ("rtx_pro_6000_pair", "gb10_dspark", "gb10_mtp")}
    assert [len(v) for v in groups.values()] == [1, 2, 2]
    a = configs[groups["rtx_pro_6000_pair"][0]]
    assert (a.tensor_parallel_size, a.gpu_indices, a.container_ipc_host, a.container_shm_size) == (2, [0, 1], True, None)
    assert a.image_ref.endswith("@sha256:64b94299abdd3bcf5bb5050ca91b378f9ee4e0b0eff4748375b95352371d7cb2")
    assert a.snapshot_dir == (
        "/mnt/data/hf/hub/models--deepseek-ai--DeepSeek-V4-Flash-0731/snapshots/7872f01b1d1fe23eabc4c98b48bffcef5a386062"
    )
    b_ranks = sorted(configs[n].node_rank for n in groups["gb10_dspark"])
    assert b_ranks == [0, 1]
    assert configs[groups["gb10_dspark"][0]].fabric_env["UCX_MEM_MMAP_HOOK_MODE"] == "none"
    for host in inv:
        assert host.data.ssh_strict_host_key_checking == "yes", "real inventories check host keys"
        assert str(host.data.ssh_hostname).startswith("192.0.2."), "documentation addresses only"


def test_sandbox_inventory_is_valid():
    configs = validate_inventory(load_inventory("inventories/sandbox.py"))
    assert sorted(configs) == ["sandbox-a", "sandbox-b0", "sandbox-b1"]


# Where a rule is about two keys, the problem is reported on the key to change.
REPORTED_AS = {("api_bind_address", "0.0.0.0"): "api_protected_by"}

BAD_SINGLE = [
    ("model_revision", "main", "40-hex commit"),
    ("model_revision", "7872F01B1D1FE23EABC4C98B48BFFCEF5A386062", "40-hex commit"),
    ("model_revision", "7872f01b", "40-hex commit"),
    ("image_digest", None, "pinned digest"),
    ("image_digest", "sha256:abc", "64 lower-case hex"),
    ("image", "registry.home.arpa/vllm@sha256:" + "a" * 64, "without '@digest'"),
    ("model_root", "data/hf", "absolute path"),
    ("model_root", "/srv/models\n[evil]", "no control characters"),
    ("jit_cache_dir", "/mnt/data/../etc", "absolute path"),
    ("container_shm_size", "16g", "container_ipc_host"),
    ("gpu_indices", [0, 0], "unique GPU indices"),
    ("gpu_indices", [], "at least one GPU"),
    ("gpu_indices", [-1, 0], "non-negative"),
    ("tensor_parallel_size", 4, "2 = 2 GPU(s) per node × 1 node(s)"),
    ("node_arch", "arm64", "'x86_64' or 'aarch64'"),
    ("api_bind_address", "0.0.0.0", "authenticating proxy"),
    ("api_bind_address", "localhost", "an IP address"),
    ("api_port", 70000, "less than or equal to 65535"),
    ("fabric_env", {"NCCL_IB_GID_INDEX": "3"}, "read from sysfs"),
    ("fabric_env", {"LD_PRELOAD": "/x.so"}, "only UCX_* and NCCL_*"),
    ("kv_offload_gib", 4, "KV_OFFLOADING_SIZE=8"),
    ("limits_nofile", 10, "greater than or equal to 1024"),
    ("limits_memlock", 100, "65536 to 2^62 bytes"),
    ("model_repo", "not a repo", "a value matching"),
    ("service_env", {"TP_SIZE": "4", "KV_OFFLOADING_SIZE": "8"}, "TP_SIZE equal to tensor_parallel_size"),
    ("service_env", {"BAD NAME": "x"}, "environment variable name"),
    ("fabric_address", "spark-b0", "IPv4 or IPv6"),
    ("model_peer_address", "10.0.0.1; rm -rf /", "a value matching"),
    ("model_peer_port", 0, "greater than or equal to 1"),
    ("model_push_fanout", 0, "greater than or equal to 1"),
    ("cluster_name", "Has Spaces", "a value matching"),
]


@pytest.mark.parametrize("key,value,expected", BAD_SINGLE, ids=[f"{k}={v!r}"[:60] for k, v, _ in BAD_SINGLE])
def test_bad_value_names_host_key_value_and_expectation(key, value, expected):
    if key == "image_digest" and value is None:
        data = node_a(image_digest=None)
    else:
        data = node_a(**{key: value})
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(data)
    msg = str(err.value)
    hashable = not isinstance(value, (dict, list))
    reported = REPORTED_AS.get((key, value), key) if hashable else key
    assert "host node-a" in msg
    assert f"key '{reported}" in msg
    assert expected in msg
    if reported == key and key != "service_env":
        shown = repr(next(iter(value))) if isinstance(value, dict) else repr(value)
        assert shown in msg
    assert "nothing was changed on any host" in msg


def test_missing_required_key_and_typo_are_named():
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(node_a(model_repo=DELETE, model_revison="7872f01b1d1fe23eabc4c98b48bffcef5a386062"))
    msg = str(err.value)
    assert "host node-a: key 'model_repo' = <missing>: expected a value (hub repository id" in msg
    assert "host node-a: key 'model_revison'" in msg and "no such key" in msg


def test_every_field_problem_is_reported_at_once():
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts({**node_a(node_arch="sparc"), **{"node-x": node_a(model_root="rel")["node-a"]}})
    problems = {(p.host, p.key) for p in err.value.problems}
    assert {("node-a", "node_arch"), ("node-x", "model_root")} <= problems


def test_pyinfra_connector_keys_are_not_schema_errors():
    data = node_a(ssh_port=2222, ssh_strict_host_key_checking="yes", _sudo=True, _env={"A": "1"})
    assert validate_hosts(data)["node-a"].cluster_name == "rtx-pro-6000-pair"


BAD_CLUSTER = [
    ("two heads", {"node_rank": 0, "fabric_address": "198.51.100.20"}, {"node_rank": 0, "fabric_address": "198.51.100.21"},
     "node_rank", "unique in cluster gb10-dspark"),
    ("no head", {"node_rank": 1, "fabric_address": "198.51.100.20"}, {"node_rank": 2, "fabric_address": "198.51.100.21"},
     "node_rank", "a rank in 0..1"),
    ("missing fabric address", HEAD, {"node_rank": 1}, "fabric_address", "spans 2 nodes"),
    ("same fabric address", HEAD, {"node_rank": 1, "fabric_address": "198.51.100.20"}, "fabric_address", "unique in cluster"),
    ("tp too small", {**HEAD, "tensor_parallel_size": 1}, {**WORKER, "tensor_parallel_size": 1},
     "tensor_parallel_size", "2 = 1 GPU(s) per node × 2 node(s)"),
    ("revision differs", HEAD, {**WORKER, "model_revision": "7872f01b1d1fe23eabc4c98b48bffcef5a386062"},
     "model_revision", "same value on every node"),
]


@pytest.mark.parametrize("b0,b1,key,expected", [c[1:] for c in BAD_CLUSTER], ids=[c[0] for c in BAD_CLUSTER])
def test_cluster_rules_name_host_and_key(b0, b1, key, expected):
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(pair_b(b0, b1))
    msg = str(err.value)
    assert f"key '{key}'" in msg and expected in msg
    assert "host node-b0" in msg or "host node-b1" in msg


def test_single_node_tp_must_match_its_gpus():
    data = node_a(tensor_parallel_size=4, service_env={**PROFILE_A["service_env"], "TP_SIZE": "4"})
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(data)
    assert "key 'tensor_parallel_size' = 4: expected 2 = 2 GPU(s) per node × 1 node(s)" in str(err.value)


def test_valid_pair_passes():
    configs = validate_hosts(pair_b(HEAD, WORKER))
    assert [configs[n].node_rank for n in ("node-b0", "node-b1")] == [0, 1]


LAUNCH_REFUSED = [
    (["--port", "9000"], "--port"),
    (["--tensor-parallel-size=4"], "--tensor-parallel-size"),
    (["-tp", "2"], "-tp"),
    (["--served_model_name", "x"], "--served-model-name"),
    (["--headless"], "--headless"),
    (["--master-addr", "10.0.0.1"], "--master-addr"),
]


@pytest.mark.parametrize("args,flag", LAUNCH_REFUSED, ids=[a[0] for a, _ in LAUNCH_REFUSED])
def test_derived_vllm_flags_are_refused_in_vllm_args(args, flag):
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(pair_b({**HEAD, "vllm_args": args}, {**WORKER, "vllm_args": args}))
    msg = str(err.value)
    assert "host node-b0" in msg and "key 'vllm_args'" in msg and f"no {flag}: the toolkit derives it" in msg


def test_cluster_nodes_may_differ_only_in_derived_values():
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(pair_b({**HEAD, "vllm_args": ["--max-num-seqs", "2"]}, {**WORKER, "vllm_args": ["--max-num-seqs", "4"]}))
    assert "key 'vllm_args'" in str(err.value) and "the same value on every node of cluster gb10-dspark" in str(err.value)


def test_image_env_launch_keeps_its_contract():
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(node_a(vllm_args=["--max-num-seqs", "2"]))
    assert "key 'vllm_args'" in str(err.value) and "image_env" in str(err.value)
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(node_a(api_port=8101, service_env={**PROFILE_A["service_env"], "PORT": "8000"}))
    assert "PORT equal to engine_port (18101)" in str(err.value)  # vLLM's own port, behind the door on api_port
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(node_a(api_port=8101, engine_port=8101))
    assert "key 'engine_port' = 8101: expected a port other than api_port" in str(err.value)
    assert validate_hosts(node_a(api_port=60000))["node-a"].engine_port == 50000  # (+10000 would pass 65535)
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(node_a(served_model_name="other", service_env={**PROFILE_A["service_env"], "SERVED_MODEL_NAME": "grandpa"}))
    assert "SERVED_MODEL_NAME equal to served_model_name (other)" in str(err.value)


def test_control_node_files_are_checked_once_the_keys_parse_and_all_at_once(tmp_path):
    """Building a NodeConfig reads no file (deploys, audits and tests construct them freely); validating a
    host checks every control-node file it names and lists every problem, not only the first."""
    from deploys.schema import NodeConfig

    missing = {"model_manifest": str(tmp_path / "m.json"), "model_hub_token_file": str(tmp_path / "token"),
               "registry_auth_file": str(tmp_path / "auth.json")}
    data = node_a(**missing)["node-a"]
    cfg = NodeConfig.model_validate({k: v for k, v in data.items() if not k.startswith(("_", "ssh_"))})
    assert cfg.model_manifest == missing["model_manifest"]
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(node_a(**missing))
    assert {(p.key, p.expected.split(" (")[0]) for p in err.value.problems} == {
        ("model_manifest", "a valid manifest"),
        ("model_hub_token_file", "an existing file on the control node"),
        ("registry_auth_file", "an existing file on the control node"),
    }


@pytest.mark.parametrize("layout", ["hf_cache", "plain"])
def test_model_paths_derived_once_for_each_layout(layout):
    from deploys.schema import NodeConfig

    cfg = NodeConfig.model_validate({**PROFILE_A, "node_rank": 0, "model_layout": layout, "model_root": "/srv/m"})
    rev = cfg.model_revision
    if layout == "hf_cache":
        assert cfg.model_dir == f"/srv/m/hub/models--{cfg.model_repo.replace('/', '--')}"
        assert (cfg.snapshot_subdir, cfg.snapshot_dir) == (f"snapshots/{rev}", f"{cfg.model_dir}/snapshots/{rev}")
        assert cfg.hub_download_dir == "/srv/m/hub"  # huggingface_hub's cache_dir: it adds models--ORG--NAME
    else:
        assert cfg.model_dir == cfg.snapshot_dir == cfg.hub_download_dir == "/srv/m" and cfg.snapshot_subdir == ""

"""Hostile and careless inventory input: every value below is refused before any connection, with host, key
and what was expected, and no secret value appears in any message (issue: hostile input)."""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

from deploys.schema import InventoryValidationError, validate_hosts, validate_inventory
from deploys.inventory import load_inventory
from tests.unit.profiles import lab_filled_in, profile

PROFILE_A = profile("rtx_pro_6000_pair")
PROFILE_B = profile("gb10_dspark")
REV = "7872f01b1d1fe23eabc4c98b48bffcef5a386062"
DIGEST = "sha256:" + "a" * 64
MODEL_DIR = "/mnt/data/hf/hub/models--deepseek-ai--DeepSeek-V4-Flash-0731"

# Secret values used below: none may appear in any message.
HF = "hf_" + "Qx7Lm2Pz9Kd4Rt8Vb1Nc6Yw3"
GH = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJl"
RANDOM = "Zk3vQ9pLw2Xr7Tb5Hn1Mc8Jd4Fs6Gy0A"  # 32 mixed characters, as `openssl rand -base64 24` gives
SECRETS = [HF, GH, JWT, RANDOM, "s3cr3t-db-pass"]


def node_a(**changes) -> dict:
    data = copy.deepcopy(PROFILE_A)
    data.update(ssh_hostname="192.0.2.10", _sudo=True)
    data.update(changes)
    return {"node-a": data}


def pair_b(b0: dict | None = None, b1: dict | None = None) -> dict:
    out = {}
    for name, rank, addr, extra in (("node-b0", 0, "198.51.100.20", b0), ("node-b1", 1, "198.51.100.21", b1)):
        data = copy.deepcopy(PROFILE_B)
        data.update({"ssh_hostname": f"192.0.2.{20 + rank}", "node_rank": rank, "fabric_address": addr, **(extra or {})})
        out[name] = data
    return out


C = "no control characters"
PATH = "a path of letters, digits"
HIDDEN_SECRET_NAME = "named like a secret"
CASES: list[tuple[str, dict, str, str]] = [
    # --- unit-file injection through a command-line item (newline, CR, tab, NUL, ESC, DEL, C1, separators)
    ("vllm_args newline ExecStartPre", node_a(vllm_launch="cli", container_exec=None, service_env={}, vllm_args=["--x\nExecStartPre=/bin/evil"]), "vllm_args", C),
    ("vllm_args carriage return", node_a(vllm_launch="cli", container_exec=None, service_env={}, vllm_args=["--x\r[Service]"]), "vllm_args", C),
    ("vllm_args tab", node_a(vllm_launch="cli", container_exec=None, service_env={}, vllm_args=["--x\tY"]), "vllm_args", C),
    ("vllm_args NUL", node_a(vllm_launch="cli", container_exec=None, service_env={}, vllm_args=["--x\0"]), "vllm_args", C),
    ("vllm_args escape", node_a(vllm_launch="cli", container_exec=None, service_env={}, vllm_args=["\x1b[2J"]), "vllm_args", C),
    ("vllm_args DEL", node_a(vllm_launch="cli", container_exec=None, service_env={}, vllm_args=["a\x7f"]), "vllm_args", C),
    ("vllm_args C1 next-line", node_a(vllm_launch="cli", container_exec=None, service_env={}, vllm_args=["a\x85b"]), "vllm_args", C),
    ("vllm_args line separator", node_a(vllm_launch="cli", container_exec=None, service_env={}, vllm_args=["a\u2028b"]), "vllm_args", C),
    ("vllm_args zero-width", node_a(vllm_launch="cli", container_exec=None, service_env={}, vllm_args=["--max\u200b-model-len"]), "vllm_args", C),
    ("vllm_args bidi override", node_a(vllm_launch="cli", container_exec=None, service_env={}, vllm_args=["\u202e--x"]), "vllm_args", C),
    ("vllm_args empty argument", pair_b({"vllm_args": ["--x", ""]}, {"vllm_args": ["--x", ""]}), "vllm_args", "no empty arguments"),
    ("container_exec empty word", node_a(container_exec='/serve.sh ""'), "container_exec", "no empty arguments"),
    ("container_exec newline", node_a(container_exec="/serve.sh\nExecStartPre=/bin/evil"), "container_exec", C),
    ("served_model_name newline", node_a(served_model_name="ds4\n"), "served_model_name", C),
    # --- environment values and names
    ("service_env value newline", node_a(service_env={**PROFILE_A["service_env"], "MODE": "x\nLD_PRELOAD=/tmp/e.so"}), "service_env", C),
    ("service_env name with space", node_a(service_env={**PROFILE_A["service_env"], "BAD NAME": "x"}), "service_env", "environment variable name"),
    ("service_env name with =", node_a(service_env={**PROFILE_A["service_env"], "A=B": "x"}), "service_env", "environment variable name"),
    ("service_env name leading digit", node_a(service_env={**PROFILE_A["service_env"], "1X": "x"}), "service_env", "environment variable name"),
    ("service_env name with dash", node_a(service_env={**PROFILE_A["service_env"], "A-B": "x"}), "service_env", "environment variable name"),
    ("service_env HF_TOKEN", node_a(service_env={**PROFILE_A["service_env"], "HF_TOKEN": HF}), "service_env", "named like a secret"),
    ("service_env HUGGING_FACE_HUB_TOKEN", node_a(service_env={**PROFILE_A["service_env"], "HUGGING_FACE_HUB_TOKEN": HF}), "service_env", "named like a secret"),
    ("service_env password", node_a(service_env={**PROFILE_A["service_env"], "DB_PASSWORD": "s3cr3t-db-pass"}), "service_env", "named like a secret"),
    ("service_env AWS secret key", node_a(service_env={**PROFILE_A["service_env"], "AWS_SECRET_ACCESS_KEY": RANDOM}), "service_env", "named like a secret"),
    ("service_env API key", node_a(service_env={**PROFILE_A["service_env"], "OPENAI_API_KEY": RANDOM}), "service_env", "named like a secret"),
    ("fabric_env secret-looking name", node_a(fabric_env={"NCCL_AUTH_TOKEN": GH}), "fabric_env", "named like a secret"),
    ("fabric_env LD_PRELOAD", node_a(fabric_env={"LD_PRELOAD": "/x.so"}), "fabric_env", "only UCX_* and NCCL_*"),
    ("fabric_env name newline", node_a(fabric_env={"NCCL_X\n": "1"}), "fabric_env", C),
    # --- secrets on the command line
    ("vllm_args --api-key", pair_b({"vllm_args": ["--api-key", RANDOM]}, {"vllm_args": ["--api-key", RANDOM]}), "vllm_args", "no secrets on the command line"),
    ("vllm_args --api-key=", pair_b({"vllm_args": [f"--api-key={RANDOM}"]}, {"vllm_args": [f"--api-key={RANDOM}"]}), "vllm_args", "no secrets on the command line"),
    ("vllm_args hf token value", pair_b({"vllm_args": ["--x", HF]}, {"vllm_args": ["--x", HF]}), "vllm_args", "no secrets on the command line"),
    # --- secrets where a path belongs, or under unknown keys
    ("token text as token file", node_a(model_hub_token_file=HF), "model_hub_token_file", "absolute path"),
    ("auth json as auth file", node_a(registry_auth_file='{"auths": {"r": {"auth": "' + RANDOM + '"}}}'), "registry_auth_file", "absolute path"),
    ("unknown key holding a token", node_a(hf_token=HF), "hf_token", "no such key"),
    ("unknown pyinfra-looking key holding a token", node_a(_hf_token=HF), "_hf_token", "no such key"),
    ("JWT as a typo'd key value", node_a(modle_hub_token=JWT), "modle_hub_token", "no such key"),
    # --- patterns: a trailing newline never passes
    ("model_revision trailing newline", node_a(model_revision=REV + "\n"), "model_revision", C),
    ("model_revision upper case", node_a(model_revision=REV.upper()), "model_revision", "40-hex commit"),
    ("model_revision branch", node_a(model_revision="main"), "model_revision", "40-hex commit"),
    ("image_digest trailing newline", node_a(image_digest=DIGEST + "\n"), "image_digest", C),
    ("image_digest short", node_a(image_digest="sha256:abc"), "image_digest", "64 lower-case hex"),
    ("image with digest", node_a(image="r.example/v@" + DIGEST), "image", "without '@digest'"),
    ("image with space", node_a(image="r.example/v x"), "image", "a value matching"),
    ("model_repo trailing newline", node_a(model_repo="org/name\n"), "model_repo", C),
    ("model_repo traversal", node_a(model_repo="../etc"), "model_repo", "a value matching"),
    ("cluster_name upper", node_a(cluster_name="Pair A"), "cluster_name", "a value matching"),
    ("container_name dots", node_a(container_name="x.service"), "container_name", "a value matching"),
    ("container_name too long", node_a(container_name="a" * 70), "container_name", "a value matching"),
    ("nvidia_driver_branch newline", node_a(nvidia_driver_branch="580\n"), "nvidia_driver_branch", C),
    ("nvidia_driver_branch 590 text", node_a(nvidia_driver_branch="590-server"), "nvidia_driver_branch", "a value matching"),
    ("deep verify time 24:00", node_a(model_deep_verify_at="24:00"), "model_deep_verify_at", "a value matching"),
    ("podman version newline", node_a(podman_min_version="4.9.3\n"), "podman_min_version", C),
    ("toolkit version shell", node_a(nvidia_toolkit_version="1.18.2;id"), "nvidia_toolkit_version", "a value matching"),
    ("kernel hold with space", node_a(nvidia_kernel_hold="6.8.0 -1"), "nvidia_kernel_hold", "a value matching"),
    ("driver package with version", node_a(nvidia_driver_packages=["nvidia-open=580.1"]), "nvidia_driver_packages", "Debian package names"),
    ("peer address shell", node_a(model_peer_address="10.0.0.1; rm -rf /"), "model_peer_address", "a value matching"),
    ("registry location quote", node_a(registries=[{"prefix": "r.example", "location": 'x"y'}]), "registries[0][location]", "a value matching"),
    # --- numbers: finite, bounded
    ("model_size_gb inf", node_a(model_size_gb=float("inf")), "model_size_gb", "finite number"),
    ("model_size_gb 'inf' string", node_a(model_size_gb="inf"), "model_size_gb", "finite number"),
    ("model_size_gb nan", node_a(model_size_gb=float("nan")), "model_size_gb", "finite number"),
    ("kv_offload_gib inf", node_a(kv_offload_gib=float("inf")), "kv_offload_gib", "finite number"),
    ("shm_headroom_gib huge", node_a(shm_headroom_gib=1e12), "shm_headroom_gib", "less than or equal to"),
    ("model_size_gb negative", node_a(model_size_gb=-1), "model_size_gb", "greater than 0"),
    ("timeout huge", node_a(service_timeout_start_sec=10**12), "service_timeout_start_sec", "less than or equal to"),
    ("restart negative", node_a(service_restart_sec=-5), "service_restart_sec", "greater than or equal to 1"),
    ("restart without delay", node_a(service_restart_sec=0), "service_restart_sec", "greater than or equal to 1"),
    ("stack huge", node_a(limits_stack=2**63), "limits_stack", "less than or equal to"),
    ("memlock huge", node_a(limits_memlock=2**63), "limits_memlock", "65536 to 2^62"),
    ("memlock word", node_a(limits_memlock="lots"), "limits_memlock", "'unlimited' or"),
    ("tp huge", node_a(tensor_parallel_size=10**6), "tensor_parallel_size", "less than or equal to"),
    ("gid index huge", node_a(nccl_ib_gid_index=1000), "nccl_ib_gid_index", "less than or equal to 255"),
    ("gpu index huge", node_a(gpu_indices=[0, 300], tensor_parallel_size=2), "gpu_indices", "up to 255"),
    ("api_port negative", node_a(api_port=-1), "api_port", "greater than or equal to 1"),
    ("api_port text", node_a(api_port="http"), "api_port", "valid integer"),
    ("rsync streams huge", node_a(model_rsync_streams=1000), "model_rsync_streams", "less than or equal to 16"),
    ("deep verify rate tiny", node_a(model_deep_verify_max_mbps=1), "model_deep_verify_max_mbps", "greater than or equal to 10"),
    # --- paths: what Volume=, ExecStartPre=, shells and rsync read back unchanged
    ("model_root space", node_a(model_root="/mnt/my models"), "model_root", PATH),
    ("model_root colon", node_a(model_root="/mnt/a:/etc"), "model_root", PATH),
    ("model_root percent", node_a(model_root="/mnt/%h"), "model_root", PATH),
    ("model_root dollar", node_a(model_root="/mnt/$HOME"), "model_root", PATH),
    ("model_root quote", node_a(model_root="/mnt/a\"b"), "model_root", PATH),
    ("model_root backslash", node_a(model_root="/mnt/a\\b"), "model_root", PATH),
    ("model_root glob", node_a(model_root="/mnt/*"), "model_root", PATH),
    ("model_root non-ASCII", node_a(model_root="/mnt/modèles"), "model_root", PATH),
    ("model_root relative", node_a(model_root="data/hf"), "model_root", "absolute path"),
    ("model_root traversal", node_a(model_root="/mnt/../etc"), "model_root", "absolute path"),
    ("jit_cache_dir colon", node_a(jit_cache_dir="/var/cache/x:ro"), "jit_cache_dir", PATH),
    ("container_tmp_dir space", node_a(container_tmp_dir="/var/tmp/a b"), "container_tmp_dir", PATH),
    ("fabric_env_file space", node_a(fabric_env_file="/etc/a b.env"), "fabric_env_file", PATH),
    ("model_mount colon", node_a(model_mount="/models:rw"), "model_mount", PATH),
    ("device relative", node_a(container_devices=["dev/infiniband"]), "container_devices[0]", "absolute path"),
    ("device with options", node_a(container_devices=["/dev/infiniband:/dev/x:rwm"]), "container_devices[0]", PATH),
    ("shm smaller than needed", node_a(container_ipc_host=False, container_shm_size="64m"), "container_shm_size", "at least 9 GiB"),
    # --- writable directories and mounts kept apart from the read-only model
    ("jit dir inside model dir", node_a(jit_cache_dir=MODEL_DIR + "/jit"), "jit_cache_dir", "outside the model directory"),
    ("jit dir is model dir", node_a(jit_cache_dir=MODEL_DIR), "jit_cache_dir", "outside the model directory"),
    ("jit dir above model dir", node_a(jit_cache_dir="/mnt/data"), "jit_cache_dir", "outside the model directory"),
    ("tmp dir inside model dir", node_a(container_tmp_dir=MODEL_DIR + "/snapshots"), "container_tmp_dir", "outside the model directory"),
    ("tmp dir is jit dir", node_a(jit_cache_dir="/var/cache/jit", container_tmp_dir="/var/cache/jit"), "container_tmp_dir", "apart from jit_cache_dir"),
    ("jit dir is /etc", node_a(jit_cache_dir="/etc"), "jit_cache_dir", "a directory of its own, outside /etc"),
    ("jit mount inside model mount", node_a(jit_cache_dir="/var/cache/jit", jit_cache_mount="/models/cache"), "jit_cache_mount", "apart from model_mount"),
    ("jit mount is model mount", node_a(jit_cache_dir="/var/cache/jit", jit_cache_mount="/models"), "jit_cache_mount", "apart from model_mount"),
    ("tmp mount above jit mount", node_a(jit_cache_dir="/var/cache/jit", jit_cache_mount="/c/jit", container_tmp_dir="/var/lib/ctmp", container_tmp_mount="/c"), "container_tmp_mount", "apart from jit_cache_mount"),
    ("model mount /", node_a(model_mount="/"), "model_mount", "not / or a system directory"),
    ("model mount /usr", node_a(model_mount="/usr"), "model_mount", "not / or a system directory"),
    ("tmp mount under /proc", node_a(container_tmp_dir="/var/lib/ctmp", container_tmp_mount="/proc/x"), "container_tmp_mount", "system directory"),
    # --- container names that would shadow a system or toolkit unit
    ("container_name nvidia-cdi-refresh", node_a(container_name="nvidia-cdi-refresh"), "container_name", "a name of its own"),
    ("container_name sshd", node_a(container_name="sshd"), "container_name", "a name of its own"),
    ("container_name systemd-journald", node_a(container_name="systemd-journald"), "container_name", "a name of its own"),
    ("container_name podman", node_a(container_name="podman"), "container_name", "a name of its own"),
    ("container_name our verify unit", node_a(container_name="inference-nodes-model-verify"), "container_name", "a name of its own"),
    # --- fabric addresses other nodes can reach
    ("fabric 0.0.0.0", pair_b({"fabric_address": "0.0.0.0"}), "fabric_address", "unicast address"),
    ("fabric loopback", pair_b({"fabric_address": "127.0.0.1"}), "fabric_address", "unicast address"),
    ("fabric multicast", pair_b({"fabric_address": "224.0.0.1"}), "fabric_address", "unicast address"),
    ("fabric broadcast", pair_b({"fabric_address": "255.255.255.255"}), "fabric_address", "unicast address"),
    ("fabric v6 unspecified", pair_b({"fabric_address": "::"}), "fabric_address", "unicast address"),
    ("fabric v6 loopback", pair_b({"fabric_address": "::1"}), "fabric_address", "unicast address"),
    ("fabric hostname", pair_b({"fabric_address": "spark-b0"}), "fabric_address", "IPv4 or IPv6"),
    ("fabric trailing space", pair_b({"fabric_address": "198.51.100.20 "}), "fabric_address", "IPv4 or IPv6"),
    ("fabric v6 not canonical", pair_b({"fabric_address": "2001:DB8:0:0::1"}), "fabric_address", "canonical form (2001:db8::1)"),
    # --- speculative decoding as data
    ("speculative flag in vllm_args", pair_b({"vllm_args": ["--speculative-config", "{}"]}, {"vllm_args": ["--speculative-config", "{}"]}), "vllm_args", "vllm_speculative_config"),
    ("speculative without method", pair_b({"vllm_speculative_config": {"num_speculative_tokens": 5}}), "vllm_speculative_config", "a `method`"),
    ("speculative tokens bool", pair_b({"vllm_speculative_config": {"method": "mtp", "num_speculative_tokens": True}}), "vllm_speculative_config", "whole number from 1 to 64"),
    ("external drafter unpinned", pair_b({"vllm_speculative_config": {"method": "draft_model", "model": "org/drafter"}}), "vllm_speculative_config", "40-hex `revision`"),
    ("external drafter on a branch", pair_b({"vllm_speculative_config": {"method": "eagle3", "model": "org/d", "revision": "main"}}), "vllm_speculative_config", "40-hex `revision`"),
    ("speculative with image_env", node_a(vllm_speculative_config={"method": "mtp"}), "vllm_speculative_config", "unset with vllm_launch image_env"),
    # --- the API and the hub token
    ("API on all interfaces", node_a(api_bind_address="0.0.0.0"), "api_protected_by", "authenticating proxy"),
    ("API bind hostname", node_a(api_bind_address="localhost"), "api_bind_address", "an IP address"),
    ("hub endpoint newline", node_a(model_hub_endpoint="https://hub.example\n"), "model_hub_endpoint", C),
    ("hub endpoint ftp", node_a(model_hub_endpoint="ftp://hub.example"), "model_hub_endpoint", "a value matching"),
    # --- pyinfra's own keys are known by name, not by prefix
    ("podman_ typo", node_a(podman_min_versoin="5.0"), "podman_min_versoin", "did you mean 'podman_min_version'"),
    ("ssh_ typo", node_a(ssh_hostnme="192.0.2.11"), "ssh_hostnme", "did you mean 'ssh_hostname'"),
    ("global argument typo", node_a(_sduo=True), "_sduo", "did you mean '_sudo'"),
    ("local_ prefix", node_a(local_cache="/x"), "local_cache", "no such key"),
    ("docker_ prefix", node_a(docker_image="x"), "docker_image", "no such key"),
    ("schema key typo", node_a(model_revison=REV), "model_revison", "did you mean 'model_revision'"),
    # --- apt's lock wait is bounded
    ("apt lock wait negative", node_a(apt_lock_timeout_s=-1), "apt_lock_timeout_s", "greater than or equal to 0"),
    ("apt lock wait a week", node_a(apt_lock_timeout_s=7 * 86400), "apt_lock_timeout_s", "less than or equal to 86400"),
    ("apt lock wait inf", node_a(apt_lock_timeout_s="inf"), "apt_lock_timeout_s", "integer"),
    # --- a profile gap naming no key
    ("profile gap typo", node_a(profile_gaps={"model_revison": "seed 003"}), "profile_gaps", "no key 'model_revison'"),
]


@pytest.mark.parametrize("hosts,key,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_value_is_refused_naming_host_key_and_expectation(hosts, key, expected):
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(hosts)
    msg = str(err.value)
    assert any(f"host {h}: key '{key}'" in msg for h in hosts), msg
    assert expected in msg, msg
    assert "nothing was changed on any host" in msg
    for secret in SECRETS:
        assert secret not in msg, f"secret leaked: {msg}"


def test_the_suite_covers_at_least_80_inputs():
    assert len(CASES) >= 80


def test_messages_read_as_sentences():
    """No pydantic internals: no 'Input should be', no union member tags, no 'expected expected'."""
    bad = [node_a(limits_memlock="lots"), node_a(node_arch="sparc"), node_a(api_port="x"),
           node_a(model_root="rel"), node_a(model_size_gb="inf"), node_a(gpu_indices="0")]
    for hosts in bad:
        with pytest.raises(InventoryValidationError) as err:
            validate_hosts(hosts)
        msg = str(err.value)
        for wrong in ("Input should", "literal[", "[int]", "expected expected", "Value error"):
            assert wrong not in msg, msg
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(node_a(limits_memlock="lots"))
    assert "key 'limits_memlock' = 'lots': expected 'unlimited' or a valid integer" in str(err.value)


def test_every_problem_of_a_host_is_listed_even_beside_a_control_character():
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(node_a(model_revision=REV + "\n", api_port=70000))
    keys = {p.key for p in err.value.problems}
    assert {"model_revision", "api_port"} <= keys


def test_secrets_are_hidden_but_ordinary_values_shown():
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(node_a(service_env={**PROFILE_A["service_env"], "HF_TOKEN": HF}, api_port=70000))
    msg = str(err.value)
    assert HF not in msg and "<hidden" in msg
    assert "'KV_OFFLOADING_SIZE': '8'" in msg, "the rest of the dict is still shown"
    assert "= 70000" in msg


def test_same_machine_under_two_names_is_refused():
    hosts = {**node_a(), "node-a-again": node_a()["node-a"]}
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(hosts)
    msg = str(err.value)
    assert "host node-a: key 'ssh_hostname' = '192.0.2.10': expected one inventory name per machine" in msg
    assert "is also node-a-again" in msg
    # the same address on another SSH port is another machine (the sandbox's nodes): accepted
    other = node_a(ssh_port=2202)["node-a"]
    other["cluster_name"] = "another-pair"
    other["endpoint_enabled"] = False  # (its endpoint address would be node-a's: one address, one host)
    assert len(validate_hosts({**node_a(), "node-other": other})) == 2


def test_loopback_fabric_only_for_nodes_on_one_host():
    with pytest.raises(InventoryValidationError):
        validate_hosts(pair_b({"fabric_address": "127.0.1.10"}, {"fabric_address": "127.0.1.11"}))
    same = {"fabric_on_one_host": True}  # one machine: one network, so each node's sshd on a port of its own
    ok = validate_hosts(pair_b({"fabric_address": "127.0.1.10", "ssh_port": 2202, **same},
                               {"fabric_address": "127.0.1.11", "ssh_port": 2203, **same}))
    assert ok["node-b0"].fabric_address == "127.0.1.10"


def test_token_over_plain_http_only_to_loopback(tmp_path):
    token = tmp_path / "token"
    token.write_text(HF)
    token.chmod(0o600)
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(node_a(model_hub_token_file=str(token), model_hub_endpoint="http://hub.example"))
    assert "an https:// endpoint" in str(err.value) and HF not in str(err.value)
    ok = validate_hosts(node_a(model_hub_token_file=str(token), model_hub_endpoint="http://127.0.0.1:8802"))
    assert ok["node-a"].model_hub_endpoint == "http://127.0.0.1:8802"


def _inventory_dir(tmp_path, body: str):
    inv = tmp_path / "inv"
    (inv / "group_data").mkdir(parents=True)
    for name in ("all.py", "rtx_pro_6000_pair.py", "gb10_dspark.py", "gb10_mtp.py"):
        (inv / "group_data" / name).write_text(open(f"inventories/group_data/{name}").read())
    (inv / "hosts.py").write_text(textwrap.dedent(body))
    return inv / "hosts.py"


def test_host_in_two_groups_that_disagree_is_named(tmp_path):
    path = _inventory_dir(tmp_path, """
        rtx_pro_6000_pair = [("node-a", {"ssh_hostname": "192.0.2.10"})]
        gb10_dspark = [("node-a", {"ssh_hostname": "192.0.2.10"})]
        gb10_mtp = [("node-c", {"ssh_hostname": "192.0.2.12"})]
    """)
    with pytest.raises(InventoryValidationError) as err:
        validate_inventory(load_inventory(str(path)))
    msg = str(err.value)
    assert "host node-a: key 'image'" in msg
    assert "the host is in groups rtx_pro_6000_pair and gb10_dspark, which set it differently" in msg


def test_host_listed_twice_is_named_by_the_cli_and_by_pyinfra_before_connecting(tmp_path):
    """pyinfra itself merges the two entries silently (the later one's values win)."""
    path = _inventory_dir(tmp_path, """
        rtx_pro_6000_pair = [("node-a", {"ssh_hostname": "127.0.0.1", "ssh_port": 1, "ssh_connect_retries": 0}),
                             ("node-a", {"ssh_hostname": "127.0.0.1", "ssh_port": 2, "ssh_connect_retries": 0})]
    """)
    expected = "host node-a: key '(inventory entry)' = 'node-a': expected one entry per host: it is listed more than once in group rtx_pro_6000_pair"
    with pytest.raises(InventoryValidationError) as err:
        validate_inventory(load_inventory(str(path)))
    assert expected in str(err.value)
    pyinfra = os.path.join(os.path.dirname(sys.executable), "pyinfra")
    proc = subprocess.run([pyinfra, "-y", str(path), "deploys/all.py"], capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and expected in out and "Could not connect" not in out, out


def test_validate_cli_needs_no_connection(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "deploys.validate", lab_filled_in(tmp_path / "lab")],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "gb10-b1.lab.example: valid (cluster gb10-dspark, rank 1)" in ok.stdout
    path = _inventory_dir(tmp_path, f"""
        rtx_pro_6000_pair = [("node-a", {{"ssh_hostname": "192.0.2.10", "api_port": 70000,
                                          "service_env": {{"HF_TOKEN": "{HF}"}}}})]
    """)
    bad = subprocess.run([sys.executable, "-m", "deploys.validate", str(path)], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 1
    assert "host node-a: key 'api_port' = 70000" in bad.stderr
    assert HF not in bad.stdout + bad.stderr


def test_pyinfra_reports_a_bad_value_before_connecting_to_any_host(tmp_path):
    """Through the real CLI and config.py: the hosts point at a listener that counts connections. A bad
    value stops the run with the problem list and the listener never sees a connection; a valid inventory
    does connect (so the listener would have seen one)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    accepted = []

    def accept():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    pyinfra = os.path.join(os.path.dirname(sys.executable), "pyinfra")
    try:
        for api_port, expect_connect in ((70000, False), (8000, True)):
            path = _inventory_dir(tmp_path / str(api_port), f"""
                rtx_pro_6000_pair = [("node-a", {{"ssh_hostname": "127.0.0.1", "ssh_port": {port},
                                                  "api_port": {api_port}, "ssh_connect_retries": 0}})]
            """)
            before = len(accepted)
            proc = subprocess.run([pyinfra, "-y", str(path), "deploys/all.py"], capture_output=True, text=True,
                                  timeout=120, cwd=os.getcwd())
            assert proc.returncode != 0
            out = proc.stdout + proc.stderr
            if expect_connect:
                assert len(accepted) > before, out
                assert "inventory validation failed" not in out
            else:
                assert len(accepted) == before, "a connection was opened before validation"
                assert "host node-a: key 'api_port' = 70000: expected a number less than or equal to 65535" in out
                assert "Traceback" not in out
    finally:
        listener.close()


@pytest.mark.parametrize("content,expected", [
    ('[1, 2]', "expected a JSON object"),
    ('{"repo": "deepseek-ai/DeepSeek-V4-Flash-0731"', "not JSON"),
    (None, "cannot be read"),
    ('{"repo": "deepseek-ai/DeepSeek-V4-Flash-0731", "commit": "' + REV + '", "files": '
     '[{"path": "../../etc/passwd", "size": 1, "sha256": "' + "0" * 64 + '"}]}', "files[0]"),
], ids=["list", "truncated", "missing", "traversal"])
def test_a_bad_manifest_is_named_never_a_traceback(tmp_path, content, expected):
    path = tmp_path / "m.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(node_a(model_manifest=str(path)))
    msg = str(err.value)
    assert f"host node-a: key 'model_manifest' = '{path}': expected a valid manifest (manifest {path}" in msg
    assert expected in msg


# --------------------------------------------------------------------------------------------------
# Careless values that would wreck a node as root (path kinds, package names, a lone `;`, host names,
# secrets under harmless names, values that crashed validation). Each is refused naming host and key.

OWN = "a directory of its own"
CLI = dict(vllm_launch="cli", container_exec=None)
CARELESS: list[tuple[str, dict, str, str]] = [
    # --- directories the sync deletes from, `venv --clear` empties, or a root container mounts writable
    ("model_root /usr", node_a(model_root="/usr"), "model_root", OWN),
    ("model_root /home", node_a(model_root="/home"), "model_root", OWN),
    ("model_root /srv", node_a(model_root="/srv"), "model_root", OWN),
    ("model_root /", node_a(model_root="/"), "model_root", OWN),
    ("model_root a home dir", node_a(model_root="/home/ops"), "model_root", OWN),
    ("model_root /root", node_a(model_root="/root"), "model_root", OWN),
    ("model_root /opt", node_a(model_root="/opt"), "model_root", OWN),
    ("model_root /mnt", node_a(model_root="/mnt"), "model_root", OWN),
    ("model_root /var/lib", node_a(model_root="/var/lib"), "model_root", OWN),
    ("model_root under /etc", node_a(model_root="/etc/models"), "model_root", "outside /etc"),
    ("model_root under /usr/local", node_a(model_root="/usr/local/models"), "model_root", "outside /usr"),
    ("model_root under /boot", node_a(model_root="/boot/m"), "model_root", "outside /boot"),
    ("model_root /var/lib/dpkg", node_a(model_root="/var/lib/dpkg/info"), "model_root", "outside /var/lib/dpkg"),
    ("model_root podman storage", node_a(model_root="/var/lib/containers/storage"), "model_root", "outside /var/lib/containers"),
    ("model_root toolkit state", node_a(model_root="/var/lib/inference-nodes"), "model_root", "outside /var/lib/inference-nodes"),
    ("model_root in /tmp", node_a(model_root="/tmp/models"), "model_root", "outside /tmp"),
    ("model_root in /run", node_a(model_root="/run/models"), "model_root", "outside /run"),
    ("model_root a user's .ssh", node_a(model_root="/home/ops/.ssh/models"), "model_root", "credentials"),
    ("model_root plain /srv", pair_b({"model_root": "/srv"}, {"model_root": "/srv"}), "model_root", OWN),
    ("hub venv /etc", node_a(model_hub_venv="/etc"), "model_hub_venv", "under /opt/inference-nodes/"),
    ("hub venv /usr/local", node_a(model_hub_venv="/usr/local"), "model_hub_venv", "under /opt/inference-nodes/"),
    ("hub venv its root", node_a(model_hub_venv="/opt/inference-nodes"), "model_hub_venv", "under /opt/inference-nodes/"),
    ("hub venv /opt/venv", node_a(model_hub_venv="/opt/venv"), "model_hub_venv", "under /opt/inference-nodes/"),
    ("hub venv inside model_root", node_a(model_root="/opt/inference-nodes/models", model_hub_venv="/opt/inference-nodes/models/venv"), "model_hub_venv", "apart from model_root"),
    ("fabric_env_file /etc/passwd", node_a(fabric_env_file="/etc/passwd"), "fabric_env_file", "under /etc/inference-nodes/"),
    ("fabric_env_file a unit", node_a(fabric_env_file="/etc/systemd/system/ssh.service"), "fabric_env_file", "under /etc/inference-nodes/"),
    ("fabric_env_file limits file", node_a(fabric_env_file="/etc/security/limits.d/90-inference-nodes.conf"), "fabric_env_file", "under /etc/inference-nodes/"),
    ("fabric_env_file the manifest", node_a(fabric_env_file="/etc/inference-nodes/model-manifest.json"), "fabric_env_file", "a `.env` file of its own"),
    ("fabric_env_file the service env", node_a(fabric_env_file="/etc/inference-nodes/grandpa.service.env"), "fabric_env_file", "a `.env` file of its own"),
    ("fabric_env_file a secret", node_a(fabric_env_file="/etc/inference-nodes/secrets/hf.env"), "fabric_env_file", "a `.env` file of its own"),
    ("jit dir /tmp", node_a(jit_cache_dir="/tmp"), "jit_cache_dir", "outside /tmp"),
    ("jit dir /dev/shm", node_a(jit_cache_dir="/dev/shm"), "jit_cache_dir", "outside /dev"),
    ("jit dir /root/.ssh", node_a(jit_cache_dir="/root/.ssh"), "jit_cache_dir", "credentials"),
    ("jit dir /usr/local/bin", node_a(jit_cache_dir="/usr/local/bin"), "jit_cache_dir", "outside /usr"),
    ("jit dir toolkit state", node_a(jit_cache_dir="/var/lib/inference-nodes/jit"), "jit_cache_dir", "outside /var/lib/inference-nodes"),
    ("jit dir toolkit wheels", node_a(jit_cache_dir="/var/cache/inference-nodes/wheels"), "jit_cache_dir", "outside /var/cache/inference-nodes/wheels"),
    ("jit dir the hub venv", node_a(jit_cache_dir="/opt/inference-nodes/hub-venv/cache"), "jit_cache_dir", "apart from model_hub_venv"),
    ("jit dir above the venv", node_a(jit_cache_dir="/opt/inference-nodes"), "jit_cache_dir", OWN),
    ("tmp dir /var/tmp", node_a(container_tmp_dir="/var/tmp"), "container_tmp_dir", "outside /var/tmp"),
    ("tmp dir /var/log", node_a(container_tmp_dir="/var/log/x"), "container_tmp_dir", "outside /var/log"),
    ("tmp dir a home dir", node_a(container_tmp_dir="/home/ops"), "container_tmp_dir", OWN),
    ("tmp dir /root/.gnupg", node_a(container_tmp_dir="/root/.gnupg/t"), "container_tmp_dir", "credentials"),
    ("control cache /", node_a(model_control_cache="/"), "model_control_cache", OWN),
    ("control cache /etc", node_a(model_control_cache="/etc/hub"), "model_control_cache", "outside /etc"),
    ("control cache /tmp itself", node_a(model_control_cache="/tmp"), "model_control_cache", "below /tmp"),
    ("cdi spec /etc/shadow", node_a(cdi_spec_path="/etc/shadow"), "cdi_spec_path", "under /etc/cdi/"),
    ("cdi spec not yaml", node_a(cdi_spec_path="/etc/cdi/nvidia.sh"), "cdi_spec_path", ".yaml or .json"),
    ("device outside /dev", node_a(container_devices=["/etc"]), "container_devices[0]", "under /dev/"),
    # --- package names reach a root shell
    ("toolkit package shell", node_a(nvidia_toolkit_packages=["nvidia-container-toolkit;id"]), "nvidia_toolkit_packages", "Debian package names"),
    ("toolkit package subshell", node_a(nvidia_toolkit_packages=["$(reboot)"]), "nvidia_toolkit_packages", "Debian package names"),
    ("toolkit package option", node_a(nvidia_toolkit_packages=["-oAPT::x=y"]), "nvidia_toolkit_packages", "Debian package names"),
    ("toolkit package with version", node_a(nvidia_toolkit_packages=["nvidia-container-toolkit=1.0"]), "nvidia_toolkit_packages", "Debian package names"),
    ("toolkit packages none", node_a(nvidia_toolkit_packages=[]), "nvidia_toolkit_packages", "at least one package"),
    ("driver package shell", node_a(nvidia_driver_packages=["nvidia-open && id"]), "nvidia_driver_packages", "Debian package names"),
    # --- a lone `;`: Quadlet 4.9.3 writes it back bare, systemd reads a command separator
    ("vllm_args lone ;", pair_b({"vllm_args": ["--x", ";", "--y"]}, {"vllm_args": ["--x", ";", "--y"]}), "vllm_args", "exactly ';'"),
    ("vllm_args trailing ;", pair_b({"vllm_args": ["--x", ";"]}, {"vllm_args": ["--x", ";"]}), "vllm_args", "exactly ';'"),
    ("container_exec lone ;", node_a(container_exec="/serve.sh ; /bin/evil"), "container_exec", "exactly ';'"),
    ("container_exec quoted ;", node_a(container_exec="/serve.sh ';'"), "container_exec", "exactly ';'"),
    ("vllm_command lone ;", pair_b({"vllm_command": ["vllm", ";", "serve"]}, {"vllm_command": ["vllm", ";", "serve"]}), "vllm_command", "exactly ';'"),
    ("container_exec unbalanced quote", node_a(container_exec="/serve.sh 'oops"), "container_exec", "balance the quotes"),
    # --- secrets under harmless names where every user can read them
    ("vllm_command token", pair_b({"vllm_command": ["vllm", "serve", HF]}, {"vllm_command": ["vllm", "serve", HF]}), "vllm_command", "no secrets on the command line"),
    ("container_exec token", node_a(container_exec=f"/serve.sh --key {RANDOM}"), "container_exec", "no secrets on the command line"),
    ("container_exec URL credentials", node_a(container_exec="/serve.sh https://ops:s3cr3t-db-pass@db.example/x"), "container_exec", "no secrets on the command line"),
    ("vllm_args URL credentials", pair_b({"vllm_args": ["--x", "https://u:s3cr3t-db-pass@h.example"]}, {"vllm_args": ["--x", "https://u:s3cr3t-db-pass@h.example"]}), "vllm_args", "no secrets on the command line"),
    ("hub endpoint credentials", node_a(model_hub_endpoint="https://ops:s3cr3t-db-pass@hub.example"), "model_hub_endpoint", "a URL of letters"),
    ("cuda repo credentials", node_a(nvidia_repo_url="https://u:s3cr3t-db-pass@repo.example/cuda"), "nvidia_repo_url", "a URL of letters"),
    ("toolkit key URL credentials", node_a(nvidia_toolkit_key_url="https://u:s3cr3t-db-pass@nvidia.example/key"), "nvidia_toolkit_key_url", "a URL of letters"),
    ("repo URL quote", node_a(nvidia_toolkit_repo_url="https://x.example/'deb"), "nvidia_toolkit_repo_url", "a URL of letters"),
    ("repo URL no host", node_a(nvidia_repo_url="https:///cuda"), "nvidia_repo_url", "a URL with a host"),
    # --- values that crashed validation or were silently read as something else
    ("ssh_port text", node_a(ssh_port="abc"), "ssh_port", "a port number from 1 to 65535"),
    ("ssh_port list", node_a(ssh_port=[22]), "ssh_port", "a port number from 1 to 65535"),
    ("ssh_port bool", node_a(ssh_port=True), "ssh_port", "a port number from 1 to 65535"),
    ("ssh_port zero", node_a(ssh_port=0), "ssh_port", "a port number from 1 to 65535"),
    ("ssh_hostname option", node_a(ssh_hostname="-oProxyCommand=id"), "ssh_hostname", "a host name or IP address"),
    ("ssh_user option", node_a(ssh_user="-oProxyCommand=id"), "ssh_user", "a user name"),
    ("gpu_indices [True]", node_a(gpu_indices=[True, 0]), "gpu_indices", "numbers, not true/false"),
    ("api_port True", node_a(api_port=True), "api_port", "numbers, not true/false"),
    ("model_size_gb False", node_a(model_size_gb=False), "model_size_gb", "numbers, not true/false"),
    ("short image name", node_a(image="vllm:deepseek-v4"), "image", "fully qualified"),
    ("short image with path", node_a(image="library/vllm"), "image", "fully qualified"),
]


@pytest.mark.parametrize("hosts,key,expected", [c[1:] for c in CARELESS], ids=[c[0] for c in CARELESS])
def test_careless_value_is_refused_naming_host_key_and_rule(hosts, key, expected):
    test_hostile_value_is_refused_naming_host_key_and_expectation(hosts, key, expected)


def test_the_careless_cases_cover_the_issue_and_30_more():
    assert len(CARELESS) >= 8 + 30


@pytest.mark.parametrize("name", ["../escape", "/", "/etc", "-oProxyCommand=id", "a b", "x/../../etc", ".."])
def test_a_host_name_that_is_a_path_or_an_option_is_refused(name):
    hosts = {name: node_a()["node-a"]}
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(hosts)
    assert f"host {name}: key '(host name)'" in str(err.value)


def test_ordinary_values_of_each_kind_still_pass():
    """The lab's own paths and a few an admin would choose are fine (a rule that refused everything would pass
    the cases above)."""
    ok = [node_a(), pair_b(),
          node_a(model_root="/data/models/ds4", jit_cache_dir="/var/cache/inference-nodes/jit/a",
                 container_tmp_dir="/var/lib/inference-tmp/a", model_hub_venv="/opt/inference-nodes/venv2"),
          node_a(model_root="/home/ops/models", model_control_cache="/tmp/hub-cache", ssh_port="2222"),
          node_a(image="localhost/vllm:x", nvidia_toolkit_packages=["nvidia-container-toolkit"]),
          node_a(fabric_env_file="/etc/inference-nodes/rdma.env", cdi_spec_path="/etc/cdi/nvidia.json")]
    for hosts in ok:
        validate_hosts(hosts)


def test_the_rules_fail_when_broken(monkeypatch):
    """Break the path rule once: the cases it guards are then accepted (the suite watches the rule)."""
    from deploys.schema import base

    monkeypatch.setattr(base, "FORBIDDEN_TREES", ())
    monkeypatch.setattr(base.OWNED_DIR, "_check", lambda p: None)
    validate_hosts(node_a(jit_cache_dir="/tmp"))
    validate_hosts(node_a(model_root="/usr"))


# --- a lone `;` through Podman 4.9.3's Quadlet and then systemd (their rules, modelled here; the node tier runs
# the real generator and systemd on hostile values)

_ESC = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"', "'": "'",
        "s": " "}


def systemd_words(line: str) -> list[str]:
    """systemd's word splitting of a command line (and Quadlet's of `Exec=`): whitespace separates, quotes
    group, C escapes are read. A word that is a bare `;` is returned as the separator marker None."""
    words, i, n = [], 0, len(line)
    while i < n:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n:
            break
        word, quoted = [], False
        while i < n and line[i] not in " \t":
            if line[i] in "\"'":
                q, quoted = line[i], True
                i += 1
                while line[i] != q:
                    if line[i] == "\\":
                        word.append(_ESC[line[i + 1]])
                        i += 2
                    else:
                        word.append(line[i])
                        i += 1
                i += 1
            elif line[i] == "\\":
                word.append(_ESC[line[i + 1]])
                i += 2
            else:
                word.append(line[i])
                i += 1
        text = "".join(word)
        words.append(None if text == ";" and not quoted else text)
    return words


def quadlet_rewrite(exec_value: str) -> str:
    """What Quadlet 4.9.3 writes into ExecStart= for an `Exec=` value: the words split (quotes and escapes
    read), then each written back, quoted only when it holds whitespace, a quote or a backslash: `;` is
    written bare (field-facts 2026-12: real generator)."""
    out = []
    for word in systemd_words(exec_value):
        assert word is not None, "a bare ';' in Exec= itself"
        if word and not any(c in word for c in " \t\"'\\"):
            out.append(word)
        else:
            out.append('"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return " ".join(out)


def executed(argv: list[str]) -> list[list[str]]:
    """The commands systemd runs for a unit whose Exec= was written by the toolkit's writer."""
    from deploys.unit_text import command_line

    commands, current = [], []
    for word in systemd_words(quadlet_rewrite(command_line(argv))):
        if word is None:
            commands.append(current)
            current = []
        else:
            current.append(word)
    return commands + [current] if current else commands


@pytest.mark.parametrize("argv", [["--x", "a;b"], ["--x", "a b"], ["--x", 'q"q'], ["--x", "back\\slash"],
                                  ["--x", "it's"], ["--x", ";;"], ["--x", "; "], ["--x", "\\;"]])
def test_values_survive_quadlets_round_trip_as_the_same_argv(argv):
    assert executed(argv) == [argv]


@pytest.mark.parametrize("argv", [["--x", ";", "--y"], ["--x", ";"]])
def test_a_lone_semicolon_would_not_survive_and_is_refused_by_the_writer(argv):
    """Modelled without the writer's refusal, the argv changes (mid-line: a second command; at the end: the
    `;` vanishes), so the writer refuses it."""
    from deploys.unit_text import UnitValueError, command_line, unit_word

    rewritten = systemd_words(quadlet_rewrite(" ".join(unit_word(a) for a in argv)))
    assert [w for w in rewritten if w is not None] != argv or None in rewritten
    with pytest.raises(UnitValueError):
        command_line(argv)


def test_apt_words_are_quoted_for_the_shell(tmp_path):
    """Package names come from the inventory and the node's package lists: every word of an apt command
    reaches the shell quoted (a stand-in program records the argv it gets)."""
    from deploys.ops import lock_waiting

    marker = tmp_path / "pwned"
    cmd = lock_waiting("printf", "%s\\n", f"pkg;touch {marker}", "$(touch {marker})", timeout=1)
    out = subprocess.run(["sh", "-c", cmd.get_raw_value()], capture_output=True, text=True, timeout=30)
    assert out.stdout.splitlines() == [f"pkg;touch {marker}", "$(touch {marker})"]
    assert not marker.exists()


def test_render_refuses_to_write_outside_its_folder(tmp_path):
    from deploys.render import inside_out_dir

    assert inside_out_dir(str(tmp_path), "node-a", "/etc/x").startswith(str(tmp_path / "node-a") + os.sep)
    for host, path in (("..", "/etc/passwd"), ("/", "/etc/passwd"), ("a", "/../../etc/passwd"), ("", "/etc/x")):
        with pytest.raises(SystemExit, match="would be written outside"):
            inside_out_dir(str(tmp_path), host, path)
    (tmp_path / "link").symlink_to("/etc")
    with pytest.raises(SystemExit, match="would be written outside"):
        inside_out_dir(str(tmp_path), "link", "/passwd")


def test_render_cli_names_problems_never_a_traceback(tmp_path):
    inv = _inventory_dir(tmp_path, f'''
        nodes = [("../../evil", {{"ssh_hostname": "192.0.2.10"}})]
        ''')
    proc = subprocess.run([sys.executable, "-m", "deploys.render", inv, str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "host ../../evil: key '(host name)'" in proc.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "evil").exists()


def test_no_service_env_value_reaches_the_unit():
    from deploys.service.unit import render_container, render_service_env

    hosts = node_a(service_env={**PROFILE_A["service_env"], "MODE": RANDOM, "DB_URL": "postgres://u:s3cr3t-db-pass@db"})
    cfg = validate_hosts(hosts)["node-a"]
    unit = render_container(cfg)
    assert RANDOM not in unit and "s3cr3t-db-pass" not in unit and "Environment=" not in unit.replace("EnvironmentFile=", "")
    env = render_service_env(cfg, None, 1)
    assert f"MODE={RANDOM}\n" in env and "DB_URL=postgres://u:s3cr3t-db-pass@db\n" in env


def test_the_sync_deletes_only_in_a_directory_the_toolkit_owns(monkeypatch, tmp_path):
    """The model directory's owner marker: an unmarked directory with files the manifest does not list fails
    the host (nothing deleted); an unmarked one holding nothing else is marked; a marked one is left as it is.
    The verifier never counts the marker as an extra file, and no manifest may list it."""
    import types

    from deploys.model import snapshot as model_snapshot
    from files.model_snapshot.snapshot_manifest import OWNER_MARKER, path_problem
    from files.model_snapshot.verify_snapshot import list_files

    monkeypatch.setattr(model_snapshot, "host", types.SimpleNamespace(name="node-x"))
    refused = list(model_snapshot.owner_commands("/srv/models/m", ["notes.txt"], owned=False))
    assert len(refused) == 1 and "notes.txt" in refused[0].args[0] and "Nothing was deleted" in refused[0].args[0]
    marked = list(model_snapshot.owner_commands("/srv/models/m", [], owned=False))
    assert len(marked) == 1 and OWNER_MARKER in marked[0].get_raw_value()
    assert list(model_snapshot.owner_commands("/srv/models/m", ["notes.txt"], owned=True)) == []
    (tmp_path / OWNER_MARKER).write_text("x")
    (tmp_path / "config.json").write_text("{}")
    assert list_files(str(tmp_path)) == {"config.json"}
    assert path_problem(OWNER_MARKER)

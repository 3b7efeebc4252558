"""The authenticated TLS endpoint (deploys/endpoint.py): validation refuses what would not serve safely, before any
connection; the lab CA tool; what is rendered, and that no key reaches any rendered file or message."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys

import pytest

from deploys.endpoint import (CLIENTS_MAP, CONF, MONITOR_MAP, UNIT_PATH, render_conf, render_loopback_door,
                              render_tls_endpoint)
from deploys.schema.control_readers import EndpointFileError, read_clients
from deploys.endpoint_ca import add_clients, endpoint_certificate, lab_ca
from deploys.preflight import own_address_problems
from deploys.schema import InventoryValidationError, NodeConfig, validate_hosts
from tests.unit.test_schema import PROFILE_B, node_a, pair_b

ENDPOINT_DIR = os.environ["INFERENCE_NODES_ENDPOINT_DIR"]  # made by tests/unit/conftest.py, as a lab would


def _keys(path: str) -> list[str]:
    return [line.split()[1] for line in open(path) if line.split() and not line.startswith("#")]


@pytest.fixture
def lab(tmp_path):
    """A lab CA directory of its own (its files may be changed by the test)."""
    d = tmp_path / "ca"
    shutil.copytree(ENDPOINT_DIR, d)
    return d


def _a(lab, **changes):
    files = {"endpoint_tls_cert": str(lab / "192.0.2.10.crt"), "endpoint_tls_key": str(lab / "192.0.2.10.key"),
             "endpoint_tls_ca": str(lab / "ca.crt"), "endpoint_clients_file": str(lab / "clients")}
    return node_a(**{**files, **changes})


def _problems(data) -> set[tuple[str, str]]:
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(data)
    text = str(err.value)
    for key in _keys(ENDPOINT_DIR + "/clients"):
        assert key not in text, "a client key in a validation message"
    return {(p.key, p.expected) for p in err.value.problems}


def test_profile_a_serves_seed_000s_clients_through_the_endpoint(lab):
    cfg = validate_hosts(_a(lab))["node-a"]
    assert (cfg.endpoint_enabled, cfg.endpoint_address, cfg.endpoint_port) == (True, "192.0.2.10", 8000)
    assert cfg.api_bind_address == "127.0.0.1" and cfg.api_port == 8000


def test_the_ca_tool_makes_a_ca_a_certificate_clients_verify_and_client_keys(tmp_path):
    d = str(tmp_path / "lab")
    out = subprocess.run([sys.executable, "-m", "deploys.endpoint_ca", d, "--address", "198.51.100.7", "--dns",
                          "node.home.arpa", "--client", "alice", "--client", "bob"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    for name in ("ca.key", "198.51.100.7.crt", "198.51.100.7.key", "clients"):
        assert stat.S_IMODE(os.stat(f"{d}/{name}").st_mode) == 0o600, name
    keys = _keys(f"{d}/clients")
    assert len(keys) == 2 and all(len(k) >= 32 for k in keys) and keys[0] != keys[1]
    assert not any(k in out.stdout + out.stderr for k in keys), "a key printed"
    verify = subprocess.run(["openssl", "verify", "-CAfile", f"{d}/ca.crt", f"{d}/198.51.100.7.crt"],
                            capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    text = subprocess.run(["openssl", "x509", "-noout", "-text", "-in", f"{d}/198.51.100.7.crt"], capture_output=True,
                          text=True).stdout
    assert "IP Address:198.51.100.7" in text and "DNS:node.home.arpa" in text
    # again: the CA, the certificate and the keys stay; a new client is added beside them
    before = {n: open(f"{d}/{n}").read() for n in ("ca.crt", "198.51.100.7.crt", "clients")}
    again = subprocess.run([sys.executable, "-m", "deploys.endpoint_ca", d, "--address", "198.51.100.7", "--dns",
                            "node.home.arpa", "--client", "alice", "--client", "carol"], capture_output=True, text=True,
                           timeout=60)
    assert again.returncode == 0, again.stderr
    assert {n: open(f"{d}/{n}").read() for n in ("ca.crt", "198.51.100.7.crt")} == {
        n: before[n] for n in ("ca.crt", "198.51.100.7.crt")}
    assert open(f"{d}/clients").read().startswith(before["clients"]) and "carol " in open(f"{d}/clients").read()
    inside = subprocess.run([sys.executable, "-m", "deploys.endpoint_ca", "ca-in-the-repo"], capture_output=True,
                            text=True, timeout=60)
    assert inside.returncode == 2 and not os.path.exists("ca-in-the-repo")


BAD = [
    ("endpoint on, no address", {"endpoint_address": None}, "endpoint_address", "a value, since endpoint_enabled is true"),
    ("a wildcard address", {"endpoint_address": "0.0.0.0"}, "endpoint_address", "one address of the head (not a wildcard"),
    ("not an address", {"endpoint_address": "compute.home.arpa"}, "endpoint_address", "an IP address"),
    ("vLLM beyond loopback", {"api_bind_address": "192.0.2.10", "api_protected_by": "the endpoint"},
     "api_bind_address", "a loopback address, since endpoint_enabled is true"),
    ("a route vLLM must not open", {"endpoint_routes": ["/v1/chat/completions", "/pause"]}, "endpoint_routes[1]",
     "'/v1/chat/completions', '/v1/completions', '/v1/models'"),
    ("no client file", {"endpoint_clients_file": None}, "endpoint_clients_file", "a value, since endpoint_enabled"),
    ("one client holds every sequence", {"endpoint_key_concurrency": 2}, "endpoint_key_concurrency",
     "below the engine's 2 sequences (--max-num-seqs / MAX_NUM_SEQS): one client would hold every one"),
    ("more than the engine runs", {"endpoint_key_concurrency": 4}, "endpoint_key_concurrency",
     "below the engine's 2 sequences"),
]


@pytest.mark.parametrize("changes,key,expected", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_validation_refuses_an_endpoint_that_would_not_serve_safely(lab, changes, key, expected):
    problems = _problems(_a(lab, **changes))
    assert key in {k for k, _ in problems}, problems
    if expected:
        assert any(expected in e for k, e in problems if k == key), problems


def test_one_client_may_not_hold_every_sequence_the_engine_runs(lab):
    """Issue 51: profile A's engine runs 2 sequences (MAX_NUM_SEQS of its script): one client gets 1 by default, so
    a second client is never queued behind the first; a profile that does not say keeps 4; nginx applies it."""
    a = validate_hosts(_a(lab))["node-a"]
    assert (a.engine_max_num_seqs, a.key_concurrency) == (2, 1)
    assert "limit_conn endpoint_inflight 1;" in render_conf(a) and "endpoint_inflight 4" not in render_conf(a)
    eight = validate_hosts(_a(lab, service_env={**a.service_env, "MAX_NUM_SEQS": "8"}))["node-a"]
    assert (eight.key_concurrency, validate_hosts(_a(lab, service_env={**a.service_env, "MAX_NUM_SEQS": "8"},
                                                     endpoint_key_concurrency=7))["node-a"].key_concurrency) == (7, 7)
    unsaid = {k: v for k, v in a.service_env.items() if k != "MAX_NUM_SEQS"}
    assert validate_hosts(_a(lab, service_env=unsaid))["node-a"].key_concurrency == 4
    one = {**a.service_env, "MAX_NUM_SEQS": "1"}
    assert validate_hosts(_a(lab, service_env=one))["node-a"].key_concurrency == 1
    assert ("endpoint_key_concurrency", "1: the engine runs one sequence at a time") in _problems(
        _a(lab, service_env=one, endpoint_key_concurrency=2))


def test_an_endpoint_on_a_worker_is_refused():
    head = {"node_rank": 0, "fabric_address": "198.51.100.20"}
    worker = {"node_rank": 1, "fabric_address": "198.51.100.21", "endpoint_enabled": True,
              "endpoint_address": "192.0.2.10", "endpoint_tls_cert": f"{ENDPOINT_DIR}/192.0.2.10.crt",
              "endpoint_tls_key": f"{ENDPOINT_DIR}/192.0.2.10.key", "endpoint_clients_file": f"{ENDPOINT_DIR}/clients"}
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(pair_b(head, worker))
    assert "host node-b1: key 'endpoint_enabled' = True: expected false on a worker" in str(err.value)
    assert PROFILE_B.get("endpoint_enabled") is not True


def test_the_control_files_are_checked_private_present_paired_and_well_formed(lab, tmp_path):
    os.chmod(lab / "192.0.2.10.crt", 0o644)
    os.remove(lab / "192.0.2.10.key")
    problems = _problems(_a(lab))
    assert ("endpoint_tls_cert", "mode 0600 (it is readable by group or others)") in problems
    assert any(k == "endpoint_tls_key" and e.startswith("an existing file") for k, e in problems), problems

    other = tmp_path / "other"
    other.mkdir()
    endpoint_certificate(str(other), "192.0.2.10", [])
    os.chmod(lab / "192.0.2.10.crt", 0o600)
    shutil.copy(other / "192.0.2.10.key", lab / "192.0.2.10.key")
    assert ("endpoint_tls_key", "the private key of endpoint_tls_cert (it belongs to another certificate)") in _problems(_a(lab))


CLIENT_FILES = [
    ("duplicate name", "alice {k1}\nalice {k2}\n", "line 2 (alice): a client named once"),
    ("duplicate key", "alice {k1}\nbob {k1}\n", "line 2 (bob): the same key as client alice"),
    ("short key", "alice {short}\n", "line 1 (alice): a key of at least 32 characters"),
    ("three words", "alice {k1} extra\n", "line 1: `name key` (two words), not 3 word(s)"),
    ("hostile name", "al;ice {k1}\n", "line 1: `name key`, the name first"),
    ("columns swapped", "{k1} alice\n", "are the columns swapped?"),
    ("columns swapped, a key of lower-case letters", "{lower} alice\n", "are the columns swapped?"),
    ("columns swapped, a key a name could be", "{name_like} alice\n", "are the columns swapped?"),
    ("hostile key", "alice {k1}\";\n", "line 1 (alice): a key of at least 32"),
    ("nobody", "# only a comment\n", "no client"),
]


@pytest.mark.parametrize("content,expected", [c[1:] for c in CLIENT_FILES], ids=[c[0] for c in CLIENT_FILES])
def test_a_clients_file_with_a_duplicate_short_or_hostile_entry_is_refused_naming_the_line_never_the_key(lab, content, expected):
    k1, k2, short, lower, name_like = "A" * 40, "B" * 40, "C" * 31, "q7" * 20 + "~", "x9" * 20
    path = lab / "clients"
    path.write_text(content.format(k1=k1, k2=k2, short=short, lower=lower, name_like=name_like))
    os.chmod(path, 0o600)
    with pytest.raises(EndpointFileError) as err:
        read_clients(str(path))
    assert expected in str(err.value)
    assert not {k1, short, lower, name_like} & set(re.split(r"[^A-Za-z0-9~]+", str(err.value)))
    problems = _problems(_a(lab))
    assert any(k == "endpoint_clients_file" and expected in e for k, e in problems), problems


def test_the_monitoring_client_must_be_in_the_file_and_someone_else_too(lab):
    assert any(k == "endpoint_metrics_client" for k, _ in _problems(_a(lab, endpoint_metrics_client="grafana")))
    add_clients(str(lab / "only"), ["prometheus"])
    problems = _problems(_a(lab, endpoint_clients_file=str(lab / "only")))
    assert ("endpoint_clients_file", "at least one client besides the monitoring one") in problems


def test_the_config_routes_only_the_allowed_paths_and_carries_no_key(lab):
    cfg = validate_hosts(_a(lab, endpoint_routes=["/v1/chat/completions", "/v1/models", "/tokenize"]))["node-a"]
    conf = render_conf(cfg)
    door, tls = render_loopback_door(cfg), render_tls_endpoint(cfg)
    assert door in conf and tls in conf
    assert re.findall(r"location = (\S+)", tls) == ["/v1/chat/completions", "/v1/models", "/tokenize", "/health",
                                                    "/metrics", "/__inference_nodes_closed",
                                                    "/__inference_nodes_anonymous"]  # (the last two: internal)
    assert "location / {\n            return 404 '{\"error\": {\"message\": \"no such route" in tls
    assert "listen 192.0.2.10:8000 ssl;" in tls and "server 127.0.0.1:18000;" in conf
    for setting in ("proxy_buffering off;", "proxy_read_timeout 3600s;", "proxy_send_timeout 3600s;",
                    "client_max_body_size 64m;", "burst=60 nodelay;", 'proxy_set_header Authorization "";'):
        assert setting in tls, setting
    assert "rate=600r/m;" in conf
    # the door on the clients' loopback port: everything passes on to vLLM, no key asked, none removed
    assert "listen 127.0.0.1:8000;" in door and "ssl" not in door and "endpoint_client" not in door
    assert re.findall(r"location (?:= )?(\S+) \{", door) == ["/health", "/metrics", "/", "/__inference_nodes_closed",
                                                           "@unreachable", "@too_slow"]
    assert conf.count("location = /__inference_nodes_closed {\n            internal;") == 2
    for fmt in conf.split("log_format")[1:]:
        assert "$http_authorization" not in fmt.split(";", 1)[0], "the key in the access log"
    for key in _keys(str(lab / "clients")):
        assert key not in conf


def test_render_shows_the_endpoint_without_its_secrets(lab, tmp_path):
    from deploys.render import host_files
    from deploys.schema import cluster_of

    configs = validate_hosts(_a(lab))
    cfg = configs["node-a"]
    cluster = cluster_of(configs, "node-a")
    files = host_files(cfg, cluster.head, cluster.size, cluster.members)
    assert files[CONF] == render_conf(cfg) and f"-c {CONF}" in files[UNIT_PATH]
    assert "workstation" in files[CLIENTS_MAP] and "prometheus" in files[MONITOR_MAP]
    text = "".join(files.values())
    assert not any(k in text for k in _keys(str(lab / "clients")))
    assert "PRIVATE KEY" not in text


def test_preflight_refuses_an_endpoint_or_exporter_address_the_node_does_not_have(lab):
    cfg = validate_hosts(_a(lab))["node-a"]
    assert own_address_problems(cfg, ["127.0.0.1/8", "192.0.2.10/24"]) == []
    assert own_address_problems(cfg, []) == []  # no iproute2: unknown, not refused
    [problem] = own_address_problems(cfg, ["127.0.0.1/8", "192.0.2.11/24"])
    assert problem.startswith("endpoint_address 192.0.2.10 is not an address of this node (it has 127.0.0.1, 192.0.2.11)")
    loopback = cfg.model_copy(update={"endpoint_address": "127.0.0.2"})
    assert own_address_problems(loopback, ["127.0.0.1/8"]) == []  # lo holds all of 127.0.0.0/8
    exporter = cfg.model_copy(update={"monitoring_enabled": True, "node_exporter_address": "192.0.2.99"})
    [problem] = own_address_problems(exporter, ["127.0.0.1/8", "192.0.2.10/24"])
    assert problem.startswith("node_exporter_address 192.0.2.99 is not an address of this node")
    assert own_address_problems(exporter.model_copy(update={"node_exporter_address": "192.0.2.10"}),
                                ["127.0.0.1/8", "192.0.2.10/24"]) == []


def test_lab_ca_is_made_once(tmp_path):
    first, _ = lab_ca(str(tmp_path))
    second, _ = lab_ca(str(tmp_path))
    assert first.serial_number == second.serial_number
    assert NodeConfig.model_fields["endpoint_enabled"].default is False


def test_the_docs_openai_snippet_builds_its_client_with_the_pinned_openai(tmp_path):
    """The block the node tier runs through the real endpoint: it compiles, and its client builds with the openai
    the test extras pin (3.x: httpx2 underneath, where an httpx.Client is refused)."""
    import ssl

    import openai

    from tests.node.test_62_endpoint import _docs_snippet

    snippet = _docs_snippet()
    compile(snippet, "docs/endpoint.md", "exec")
    assert "DefaultHttpx2Client(verify=ssl.create_default_context(cafile=" in snippet
    client = openai.OpenAI(base_url="https://192.0.2.10:8000/v1", api_key="k" * 43,
                           http_client=openai.DefaultHttpx2Client(verify=ssl.create_default_context()))
    assert str(client.base_url) == "https://192.0.2.10:8000/v1/"

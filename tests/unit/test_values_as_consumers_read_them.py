"""Every value checked the way its consumer reads it (issue 40, sections 1-3): secrets never printed, control-node
files checked by what they hold, one table of addresses and ports per host, bounds that agree with the program that
reads the value. Each root cause with several values; every message names the host and key and holds no fake secret."""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from deploys.monitoring import host_files as mon_files, rules as mon_rules
from deploys.endpoint import read_clients, render_conf
from deploys.inventory import load_inventory
from deploys.schema import InventoryValidationError, validate_hosts, validate_inventory
from tests.unit.test_hostile_input import node_a, pair_b

ENDPOINT_DIR = os.environ["INFERENCE_NODES_ENDPOINT_DIR"]
KEY_A, KEY_B = "Zk3vQ9pLw2Xr7Tb5Hn1Mc8Jd4Fs6Gy0AqW", "q7q7q7q7q7q7q7q7q7q7q7q7q7q7q7q7q7q7"
WEBHOOK = "https://hooks.example.com/services/T0AAAA/B0BBBB/xoxSecretPart9"
WEBHOOK_TOKEN = "xoxSecretPart9"


def _refused(hosts: dict, *, secrets: tuple[str, ...] = ()) -> dict[tuple[str, str], str]:
    """The problems of ``hosts`` as {(host, key): expectation}; no fake secret in the message or any problem."""
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(hosts)
    text = str(err.value)
    for secret in (*secrets, KEY_A, KEY_B, WEBHOOK_TOKEN, *_client_keys()):
        assert secret not in text, f"a secret in the message: {text}"
    out: dict[tuple[str, str], str] = {}
    for p in err.value.problems:  # two problems of one key: both expectations, joined
        out[(p.host, p.key)] = f"{out[(p.host, p.key)]} | {p.expected}" if (p.host, p.key) in out else p.expected
    return out


def _client_keys() -> list[str]:
    return [line.split()[1] for line in open(f"{ENDPOINT_DIR}/clients") if line.split() and line[0] != "#"]


@pytest.fixture
def lab(tmp_path):
    d = tmp_path / "lab"
    shutil.copytree(ENDPOINT_DIR, d)
    return d


def _files(lab, **changes) -> dict:
    return {"endpoint_tls_cert": str(lab / "192.0.2.10.crt"), "endpoint_tls_key": str(lab / "192.0.2.10.key"),
            "endpoint_tls_ca": str(lab / "ca.crt"), "endpoint_clients_file": str(lab / "clients"), **changes}


def _secret_file(path, text: str, mode: int = 0o600) -> str:
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


# --- 1. Secrets never printed ---------------------------------------------------------------------------------

PASTED = [
    ("clients file's text as endpoint_clients_file", "endpoint_clients_file", f"alice {KEY_A}\nbob {KEY_B}\n"),
    ("one `name key` line as endpoint_clients_file", "endpoint_clients_file", f"alice {KEY_B}"),
    ("the webhook URL as alertmanager_webhook_url_file", "alertmanager_webhook_url_file", WEBHOOK),
    ("a PEM key as endpoint_tls_key", "endpoint_tls_key", "-----BEGIN PRIVATE KEY-----\n" + KEY_A),
    ("a PEM block as endpoint_tls_ca", "endpoint_tls_ca", "-----BEGIN PRIVATE KEY----- " + KEY_B),
    ("a key as endpoint_tls_cert", "endpoint_tls_cert", KEY_B),
    ("the hub token as model_hub_token_file", "model_hub_token_file", KEY_B),
]


@pytest.mark.parametrize("key,value", [c[1:] for c in PASTED], ids=[c[0] for c in PASTED])
def test_a_secret_pasted_where_its_file_belongs_is_refused_unseen(key, value):
    problems = _refused(node_a(**{key: value}))
    assert ("node-a", key) in problems


@pytest.mark.parametrize("key", ["alertmanager_webhok_url_file", "alertmanager_webhook_url", "webhook", "slack_url"])
def test_a_secret_under_a_misspelled_or_unknown_key_is_refused_unseen(key):
    problems = _refused(node_a(**{key: WEBHOOK}))
    assert "no such key" in problems[("node-a", key)]


def test_an_unknown_key_with_a_number_still_shows_it():
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(node_a(endpoint_prot=8443))
    assert "key 'endpoint_prot' = 8443: expected no such key (did you mean 'endpoint_port'?" in str(err.value)


@pytest.mark.parametrize("content", [f"{KEY_A} alice\n", f"{KEY_B} alice\n", f"alice {KEY_A}\n{KEY_B} bob\n"],
                         ids=["mixed-case key first", "lower-case key first (a valid name)", "second line swapped"])
def test_a_clients_file_with_its_columns_swapped_never_shows_the_key(lab, content):
    clients = _secret_file(lab / "clients", content)
    problems = _refused(node_a(**_files(lab, endpoint_clients_file=clients)))
    assert "are the columns swapped?" in problems[("node-a", "endpoint_clients_file")]


def _cert(path, *, key=None, issuer_key=None, issuer_name=None, ip="192.0.2.10", algorithm=None, days=30,
          ca=False) -> tuple[str, object]:
    key = key or ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer_name or subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ip:
        import ipaddress
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]),
                                        critical=False)
    cert = builder.sign(issuer_key or key, algorithm or hashes.SHA256())
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    os.chmod(path, 0o600)
    return str(path), key


def _key_file(path, key, password: bytes | None = None) -> str:
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    os.chmod(path, 0o600)
    return str(path)


def _lab_ca(lab):
    ca_cert = x509.load_pem_x509_certificate((lab / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((lab / "ca.key").read_bytes(), password=None)
    return ca_cert.subject, ca_key


def test_the_lab_cas_private_key_given_as_endpoint_tls_ca_is_refused_and_never_shown(lab):
    key_text = (lab / "ca.key").read_text()
    problems = _refused(node_a(**_files(lab, endpoint_tls_ca=str(lab / "ca.key"))),
                        secrets=tuple(line for line in key_text.splitlines() if "-----" not in line))
    assert problems == {("node-a", "endpoint_tls_ca"): problems[("node-a", "endpoint_tls_ca")]}
    assert "certificates only: the file holds a private key" in problems[("node-a", "endpoint_tls_ca")]


def test_a_file_that_is_not_a_certificate_is_refused_as_the_ca(lab):
    shadow = _secret_file(lab / "shadow", "root:$y$j9T$abc:19000:0:99999:7:::\n", 0o640)
    problems = _refused(node_a(**_files(lab, endpoint_tls_ca=shadow)), secrets=("$y$j9T$abc",))
    assert "a PEM file of certificates only" in problems[("node-a", "endpoint_tls_ca")]


@pytest.mark.parametrize("mode,owner,expected", [
    (0o666, None, "writable by group or others"),
    (0o644, 65534, "a file owned by the user running the deploy"),
])
def test_a_ca_others_could_change_is_refused(lab, mode, owner, expected):
    os.chmod(lab / "ca.crt", mode)
    if owner is not None:
        if os.geteuid() != 0:
            pytest.skip("chown needs root (make test runs as root)")
        os.chown(lab / "ca.crt", owner, -1)
    assert expected in _refused(node_a(**_files(lab)))[("node-a", "endpoint_tls_ca")]


def test_a_secret_file_owned_by_another_user_is_refused(lab):
    if os.geteuid() != 0:
        pytest.skip("chown needs root (make test runs as root)")
    os.chown(lab / "clients", 65534, -1)
    assert "owned by the user running the deploy" in _refused(node_a(**_files(lab)))[("node-a", "endpoint_clients_file")]


def test_a_bad_certificate_is_reported_under_the_certificates_key_not_the_keys(lab):
    subject, ca_key = _lab_ca(lab)
    cases = {
        "the key file as the certificate": ({"endpoint_tls_cert": str(lab / "192.0.2.10.key")}, "endpoint_tls_cert",
                                             "certificates only"),
        "a name that is not the endpoint's": (_pair(lab, issuer=(subject, ca_key), ip="192.0.2.99"), "endpoint_tls_cert",
                                              "subject alternative names hold endpoint_address 192.0.2.10"),
        "no IP name at all": (_pair(lab, issuer=(subject, ca_key), ip=None), "endpoint_tls_cert", "no IP address"),
        "another CA's certificate": (_pair(lab), "endpoint_tls_cert", "issued by the CA of endpoint_tls_ca"),
        "a 1024-bit RSA key": (_pair(lab, issuer=(subject, ca_key), key=rsa.generate_private_key(65537, 1024)),
                               "endpoint_tls_cert", "a 1024-bit key (2048 bits at least)"),
        "a SHA-1 signature": (_sha1_pair(lab), "endpoint_tls_cert", "SHA1 is refused"),
        "out of date": (_pair(lab, issuer=(subject, ca_key), days=-1), "endpoint_tls_cert", "a certificate in date"),
    }
    for name, (changes, key, expected) in cases.items():
        problems = _refused(node_a(**_files(lab, **changes)))
        assert key in {k for _, k in problems}, name
        assert "endpoint_tls_key" not in {k for _, k in problems}, (name, problems)
        assert expected in problems[("node-a", key)], (name, problems)


def _sha1_pair(lab) -> dict:
    """A certificate of the lab CA signed with SHA-1 (cryptography refuses to make one; OpenSSL's CLI still does)."""
    key = _key_file(lab / "sha1.key", ec.generate_private_key(ec.SECP256R1()))
    (lab / "san.ext").write_text("subjectAltName=IP:192.0.2.10\n")
    csr = subprocess.run(["openssl", "req", "-new", "-key", key, "-subj", "/CN=test"], capture_output=True, check=True)
    subprocess.run(["openssl", "x509", "-req", "-sha1", "-days", "30", "-CA", str(lab / "ca.crt"), "-CAkey",
                    str(lab / "ca.key"), "-set_serial", "7", "-extfile", str(lab / "san.ext"), "-out",
                    str(lab / "sha1.crt")], input=csr.stdout, capture_output=True, check=True)
    os.chmod(lab / "sha1.crt", 0o600)
    return {"endpoint_tls_cert": str(lab / "sha1.crt"), "endpoint_tls_key": key}


def _pair(lab, *, issuer=None, key=None, **cert_args) -> dict:
    name = f"c{len(os.listdir(lab))}"
    subject, ca_key = issuer or (None, None)
    cert, key = _cert(lab / f"{name}.crt", key=key, issuer_key=ca_key, issuer_name=subject, **cert_args)
    return {"endpoint_tls_cert": cert, "endpoint_tls_key": _key_file(lab / f"{name}.key", key)}


def test_a_bad_key_is_reported_under_the_keys_key(lab):
    cert = str(lab / "192.0.2.10.crt")
    key = serialization.load_pem_private_key((lab / "192.0.2.10.key").read_bytes(), password=None)
    cases = {
        "another certificate's key": (_key_file(lab / "other.key", ec.generate_private_key(ec.SECP256R1())),
                                      "the private key of endpoint_tls_cert"),
        "a key with a passphrase": (_key_file(lab / "locked.key", key, b"pass-phrase"), "an unencrypted PEM private key"),
        "the certificate as the key": (_secret_file(lab / "cert-as-key", (lab / "192.0.2.10.crt").read_text()),
                                       "one PEM private key and nothing else"),
    }
    for name, (path, expected) in cases.items():
        problems = _refused(node_a(**_files(lab, endpoint_tls_cert=cert, endpoint_tls_key=path)))
        assert set(problems) == {("node-a", "endpoint_tls_key")}, (name, problems)
        assert expected in problems[("node-a", "endpoint_tls_key")], name


def test_the_lab_ca_tools_files_pass(lab):
    assert validate_hosts(node_a(**_files(lab)))["node-a"].endpoint_tls_ca == str(lab / "ca.crt")


def test_security_docs_say_what_each_control_node_file_must_hold():
    from deploys.schema.problems import control_file_keys

    text = open("docs/security.md").read()
    for key in control_file_keys():
        assert f"`{key}`" in text, key


# --- 2. One table of addresses and ports per host ---------------------------------------------------------------

ADDRESSES = [
    ("endpoint_address", "::1%lo", "without a zone"),
    ("endpoint_address", "fe80::1%eth0", "without a zone"),
    ("endpoint_address", "192.0.2.10;} server {listen 80", "an IP address"),
    ("endpoint_address", "::ffff:0.0.0.0", "not IPv4-mapped"),
    ("endpoint_address", "::ffff:192.0.2.10", "not IPv4-mapped"),
    ("api_bind_address", "::1%lo", "without a zone"),
    ("api_bind_address", "0:0:0:0:0:0:0:1", "canonical form (::1)"),
    ("api_bind_address", "127.000.000.001", "an IP address"),
    ("node_exporter_address", "::ffff:127.0.0.1", "not IPv4-mapped"),
    ("node_exporter_address", "0:0:0:0:0:0:0:1", "canonical form (::1)"),
    ("node_exporter_address", "2001:DB8::1", "canonical form (2001:db8::1)"),
    ("fabric_address", "fe80::1%eth0", "without a zone"),
]


@pytest.mark.parametrize("key,value,expected", ADDRESSES, ids=[f"{k}={v}" for k, v, _ in ADDRESSES])
def test_an_address_is_parsed_once_and_refused_with_a_zone_a_mapping_or_another_spelling(key, value, expected):
    data = {key: value, "monitoring_enabled": True} if key == "node_exporter_address" else {key: value}
    hosts = pair_b(data, {}) if key == "fabric_address" else node_a(**data)
    problems = _refused(hosts)
    host = "node-b0" if key == "fabric_address" else "node-a"
    assert expected in problems[(host, key)]


def _inventory(tmp_path, body: str):
    path = tmp_path / f"inv{len(list(tmp_path.glob('inv*.py')))}.py"  # a file each: an inventory is loaded once
    path.write_text(textwrap.dedent(body))
    return load_inventory(str(path))


@pytest.mark.parametrize("address", ["127.0.0.2", "::1", "127.0.0.1"])
def test_a_loopback_exporter_address_on_a_watched_node_is_refused(tmp_path, address):
    a = node_a()["node-a"]
    inventory = _inventory(tmp_path, f"""
        one = [("n1", {a!r}), ("n2", {{**{a!r}, "cluster_name": "other", "ssh_hostname": "192.0.2.30",
                                       "endpoint_enabled": False, "monitoring_enabled": True,
                                       "node_exporter_address": {address!r}}})]
        monitoring = ["n1"]
    """)
    with pytest.raises(InventoryValidationError) as err:
        validate_inventory(inventory)
    assert f"host n2: key 'node_exporter_address' = '{address}': expected an address of n2" in str(err.value)


def test_two_nodes_naming_one_exporter_address_are_refused():
    b = {"monitoring_enabled": True, "node_exporter_address": "198.51.100.20"}
    problems = _refused(pair_b(b, b))
    assert "it is also node-b1's node_exporter_address" in problems[("node-b0", "node_exporter_address")]
    assert "it is also node-b0's" in problems[("node-b1", "node_exporter_address")]


COLLISIONS = [
    ("exporter on the head's torch port", pair_b({"monitoring_enabled": True, "node_exporter_port": 29500}, {}),
     ("node-b0", "node_exporter_port"), "collides with the head's torch rendezvous (it binds every address) (vllm_master_port)"),
    ("exporter on the API's door", node_a(monitoring_enabled=True, node_exporter_port=8000),
     ("node-a", "node_exporter_port"), "collides with the API's door (api_port) on 127.0.0.1:8000"),
    ("exporter on vLLM's own port", node_a(monitoring_enabled=True, node_exporter_port=18000),
     ("node-a", "node_exporter_port"), "collides with vLLM's API (engine_port) on 127.0.0.1:18000"),
    ("vLLM's own port on the torch rendezvous", pair_b({"engine_port": 29500}, {}),
     ("node-b0", "vllm_master_port"), "collides with vLLM's API (engine_port) on 127.0.0.1:29500"),
    ("endpoint on sshd's port", node_a(endpoint_port=22), ("node-a", "endpoint_port"), "collides with sshd (ssh_port)"),
    ("endpoint on a non-default sshd port", node_a(ssh_port=2222, endpoint_port=2222), ("node-a", "endpoint_port"),
     "sshd (ssh_port) on every address:2222"),
    ("exporter on the endpoint's port", node_a(monitoring_enabled=True, node_exporter_address="192.0.2.10",
                                               node_exporter_port=8000),
     ("node-a", "node_exporter_port"), "collides with"),
    ("the fan-out's daemon on vLLM's port", node_a(model_sync_mode="push", model_peer_port=8000,
                                                   model_peer_address="127.0.0.1"),
     ("node-a", "model_peer_port"), "collides with the API's door"),
    ("the worker's API is no listener, its sshd is", pair_b({}, {"model_sync_mode": "push", "model_peer_port": 22}),
     ("node-b1", "model_peer_port"), "collides with sshd"),
]


@pytest.mark.parametrize("hosts,where,expected", [c[1:] for c in COLLISIONS], ids=[c[0] for c in COLLISIONS])
def test_two_listeners_of_one_host_on_one_port_are_refused_before_any_connection(hosts, where, expected):
    problems = _refused(hosts)
    assert where in problems, problems
    assert expected in problems[where]


def test_prometheus_and_alertmanager_join_the_monitoring_hosts_table(tmp_path):
    a = node_a()["node-a"]
    for key, port, clash in (("prometheus_port", 8000, "the API's door"), ("alertmanager_port", 22, "sshd"),
                             ("alertmanager_port", 9090, "Prometheus")):
        inventory = _inventory(tmp_path, f"""
            one = [("n1", {{**{a!r}, {key!r}: {port}}})]
            monitoring = ["n1"]
        """)
        with pytest.raises(InventoryValidationError) as err:
            validate_inventory(inventory)
        problem = next(p for p in err.value.problems if p.key == key)
        assert problem.host == "n1" and clash in problem.expected
    # the same ports on a host that runs neither are no collision
    assert validate_hosts(node_a(prometheus_port=8000, alertmanager_port=22))


def test_the_sandbox_one_machine_table_passes_and_a_clash_across_its_nodes_is_named():
    same = {"fabric_on_one_host": True}
    ok = validate_hosts(pair_b({"fabric_address": "127.0.1.10", "ssh_port": 2202, **same},
                               {"fabric_address": "127.0.1.11", "ssh_port": 2203, **same}))
    assert set(ok) == {"node-b0", "node-b1"}
    problems = _refused(pair_b({"fabric_address": "127.0.1.10", "ssh_port": 2202, **same},
                               {"fabric_address": "127.0.1.11", "ssh_port": 2202, **same}))
    assert "collides with node-b0's sshd" in problems[("node-b1", "ssh_port")]


# --- 3. Bounds that agree with the program that reads them ---------------------------------------------------

def test_an_endpoint_burst_nginx_refuses_is_refused_and_the_least_it_takes_renders():
    assert "greater than or equal to 1" in _refused(node_a(endpoint_rate_burst=0))[("node-a", "endpoint_rate_burst")]
    cfg = validate_hosts(node_a(endpoint_rate_burst=1))["node-a"]
    assert "burst=1 nodelay" in render_conf(cfg)


def test_a_disk_threshold_beyond_the_bound_is_refused_and_the_largest_renders():
    assert ("node-a", "alert_model_disk_free_min_gib") in _refused(node_a(alert_model_disk_free_min_gib=1e300))
    cfg = validate_hosts(node_a(alert_model_disk_free_min_gib=2**20))["node-a"]
    rule = next(r for r in mon_rules.alert_rules(cfg) if r["alert"] == "ModelDiskNearlyFull")
    assert str(2**50) in rule["expr"]


def test_a_host_name_too_long_for_a_file_name_is_refused_and_the_longest_fits():
    from deploys.schema.cross_host import HOST_NAME_MAX

    long = "n" * (HOST_NAME_MAX + 1)
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts({long: node_a()["node-a"]})
    assert f"a name of at most {HOST_NAME_MAX} characters" in str(err.value)
    longest = "n" * HOST_NAME_MAX
    for name in (mon_files.scrape_key_path(longest), mon_files.ca_path(longest)):
        assert len(os.path.basename(name).encode()) <= 255
    assert validate_hosts({longest: node_a()["node-a"]})


GO_AND_PYTHON_DISAGREE = [
    "http://hooks.example.com:abc/x", "http://hooks.example.com:99999/x", "http://hooks%2eexample.com/x",
    "http://hooks.example.com/a b", "http://hooks.example.com\\@evil/x", "https://hooks.example.com/x#frag",
    "http://[fe80::1%25eth0]:8080/x", "http://[::1/x", "http://hooks_example.com/x", "http://300.1.1.1/x",
    "http://hooks.example.com/%zz", "ftp://hooks.example.com/x", "http:///x", "http://hooks.example.com/\"x\"",
]


@pytest.mark.parametrize("url", GO_AND_PYTHON_DISAGREE)
def test_a_webhook_url_alertmanager_would_read_otherwise_is_refused_unseen(tmp_path, url):
    path = _secret_file(tmp_path / "url", url + "\n")
    problems = _refused(node_a(alertmanager_webhook_url_file=path), secrets=(url,))
    assert ("node-a", "alertmanager_webhook_url_file") in problems


@pytest.mark.parametrize("url", ["https://hooks.example.com/services/T0/B0/abc", "http://127.0.0.1:9199/alerts",
                                 "http://[2001:db8::5]:8080/hook?token=abc%20def", "https://user:pw@h.example/x"])
def test_ordinary_webhook_urls_pass(tmp_path, url):
    path = _secret_file(tmp_path / "url", url + "\n")
    assert validate_hosts(node_a(alertmanager_webhook_url_file=path))


def test_monitoring_on_without_a_monitoring_host_is_refused(tmp_path):
    a = node_a()["node-a"]
    inventory = _inventory(tmp_path, f"""
        one = [("n1", {{**{a!r}, "monitoring_enabled": True}})]
    """)
    with pytest.raises(InventoryValidationError) as err:
        validate_inventory(inventory)
    assert "host n1: key 'monitoring_enabled' = True: expected a host in the inventory group `monitoring`" in str(err.value)


def test_the_validate_cli_prints_no_secret(tmp_path):
    a = node_a()["node-a"]
    (tmp_path / "inv.py").write_text(textwrap.dedent(f"""
        one = [("n1", {{**{a!r}, "endpoint_clients_file": "alice {KEY_A}", "alertmanager_webhok_url_file": {WEBHOOK!r}}})]
    """))
    out = subprocess.run([sys.executable, "-m", "deploys.validate", str(tmp_path / "inv.py")], capture_output=True,
                         text=True)
    assert out.returncode == 1
    text = out.stdout + out.stderr
    assert "endpoint_clients_file" in text and "alertmanager_webhok_url_file" in text
    assert not re.search(f"{KEY_A}|{WEBHOOK_TOKEN}", text)


# --- The consumer itself: nginx reads the endpoint's configuration at the bounds validation admits ----------------

NGINX = os.path.join(os.environ.get("SANDBOX_DIR", "/var/tmp/inference-nodes-sandbox"), "tools", "nginx")


@pytest.fixture(scope="module")
def nginx() -> str:
    if os.geteuid() != 0:
        pytest.skip("nginx -t in a network namespace of its own needs root (make test runs as root)")
    if not os.access(NGINX, os.X_OK):
        pytest.fail(f"no nginx at {NGINX}: run `tests/sandbox/node.sh nginx` (make test and make unit do)")
    return NGINX


def nginx_root(tmp_path, cfg):
    """The rendered configuration and the files it reads, its node paths moved under ``tmp_path / "node"`` (the
    client maps, the certificate and key, its pid, temp and log places, the closed-door flag's folder)."""
    from deploys import endpoint
    from deploys.endpoint import render_maps

    root = tmp_path / "node"
    conf = render_conf(cfg)
    for node_dir in (endpoint.DIR, "/run/inference-nodes-endpoint", "/var/cache/inference-nodes-endpoint",
                     "/var/log/inference-nodes-endpoint"):
        (root / node_dir.strip("/")).mkdir(parents=True, exist_ok=True)
        conf = conf.replace(node_dir + "/", f"{root}{node_dir}/")
    clients_map, monitor_map = render_maps(cfg, read_clients(cfg.endpoint_clients_file))
    (root / endpoint.CLIENTS_MAP.strip("/")).write_text(clients_map)
    (root / endpoint.MONITOR_MAP.strip("/")).write_text(monitor_map)
    shutil.copy(cfg.endpoint_tls_cert, root / endpoint.CERT.strip("/"))
    shutil.copy(cfg.endpoint_tls_key, root / endpoint.KEY.strip("/"))
    (root / "nginx.conf").write_text(conf)
    return root


def in_own_network(cfg, script: str, *args: str) -> subprocess.CompletedProcess:
    """``script`` (sh, with ``args``) in a network namespace of its own whose loopback holds the endpoint's address
    (nginx binds its listen address, `-t` too)."""
    family = "-6" if ":" in cfg.endpoint_address else "-4"
    setup = (f"ip link set lo up && {{ ip {family} addr add {cfg.endpoint_address} dev lo nodad 2>/dev/null || "
             f"ip {family} addr add {cfg.endpoint_address} dev lo; }}; ")
    return subprocess.run(["unshare", "-n", "sh", "-c", setup + script, "sh", *args], capture_output=True, text=True,
                          timeout=120)


def nginx_t(nginx: str, tmp_path, cfg) -> subprocess.CompletedProcess:
    """`nginx -t` of the rendered configuration (``nginx_root``)."""
    root = nginx_root(tmp_path, cfg)
    return in_own_network(cfg, 'exec "$1" -t -p "$2" -e stderr -c "$2/nginx.conf"', nginx, str(root))


EDGES = [
    ("every bound at its least", dict(endpoint_rate_burst=1, endpoint_rate_per_minute=1, endpoint_max_body_mb=1,
                                      endpoint_read_timeout_s=60, endpoint_send_timeout_s=60, endpoint_port=1)),
    ("every bound at its most", dict(endpoint_rate_burst=100_000, endpoint_rate_per_minute=1_000_000,
                                     endpoint_max_body_mb=4096, endpoint_read_timeout_s=86400,
                                     endpoint_send_timeout_s=86400, endpoint_port=65535)),
    ("every route", dict(endpoint_routes=["/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/responses",
                                          "/v1/embeddings", "/tokenize", "/detokenize"], endpoint_metrics_client=None)),
    ("an IPv6 endpoint before an IPv6 loopback API", dict(endpoint_address="2001:db8::10", api_bind_address="::1")),
]


@pytest.mark.parametrize("changes", [c[1] for c in EDGES], ids=[c[0] for c in EDGES])
def test_nginx_reads_the_endpoint_configuration_at_every_bound_validation_admits(nginx, lab, tmp_path, changes):
    from deploys.endpoint_ca import endpoint_certificate

    files = _files(lab)
    if ":" in changes.get("endpoint_address", ""):  # (its file names hold ':': copied to names a path key takes)
        cert, key = endpoint_certificate(str(lab), changes["endpoint_address"], [])
        shutil.copy(cert, lab / "v6.crt")
        shutil.copy(key, lab / "v6.key")
        files.update(endpoint_tls_cert=str(lab / "v6.crt"), endpoint_tls_key=str(lab / "v6.key"))
    cfg = validate_hosts(node_a(**files, **changes))["node-a"]
    out = nginx_t(nginx, tmp_path, cfg)
    assert out.returncode == 0, out.stderr
    assert "test is successful" in out.stderr


def test_nginx_refuses_the_burst_validation_refuses(nginx, lab, tmp_path):
    """The bound's reason, shown on the consumer: a burst of 0 is what nginx itself refuses."""
    cfg = validate_hosts(node_a(**_files(lab)))["node-a"].model_copy(update={"endpoint_rate_burst": 0})
    out = nginx_t(nginx, tmp_path, cfg)
    assert out.returncode != 0 and "burst" in out.stderr


AMTOOL = os.path.join(os.environ.get("SANDBOX_DIR", "/var/tmp/inference-nodes-sandbox"), "tools", "amtool")


@pytest.fixture(scope="module")
def amtool() -> str:
    if not os.access(AMTOOL, os.X_OK):
        pytest.fail(f"no amtool at {AMTOOL}: run `tests/sandbox/node.sh amtool` (make test and make unit do)")
    return AMTOOL


def amtool_check(amtool: str, tmp_path, url: str) -> subprocess.CompletedProcess:
    cfg = validate_hosts(node_a())["node-a"]
    path = tmp_path / "alertmanager.yml"
    path.write_text(mon_files.render_alertmanager(cfg, url))
    return subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("url", ["https://hooks.example.com/services/T0/B0/abc", "http://127.0.0.1:9199/alerts",
                                 "http://[2001:db8::5]:8080/hook?token=abc%20def", "https://user:pw@h.example/x"])
def test_alertmanager_reads_every_webhook_url_validation_passes(amtool, tmp_path, url):
    out = amtool_check(amtool, tmp_path, url)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("url", ["http://hooks.example.com:abc/x", "http://hooks%2eexample.com/x",
                                 "http://hooks.example.com/%zz"])
def test_urls_python_takes_and_alertmanager_refuses_are_the_ones_validation_refuses(amtool, tmp_path, url):
    from urllib.parse import urlsplit

    urlsplit(url)  # Python's parser takes it
    assert amtool_check(amtool, tmp_path, url).returncode != 0
    path = _secret_file(tmp_path / "url", url + "\n")
    assert ("node-a", "alertmanager_webhook_url_file") in _refused(node_a(alertmanager_webhook_url_file=path),
                                                                   secrets=(url,))


def test_the_closed_door_answers_json_503_with_retry_after_and_opens_with_its_flag(nginx, lab, tmp_path):
    """The real nginx with the rendered configuration: while the closed-door flag exists, a client with a key gets
    an OpenAI-style JSON 503 with Retry-After on every API route (one without a key still 401), and so does a client
    of the loopback door; the Retry-After is what the door's hint file says (30 s without one); without the flag the
    request goes through to vLLM (here none listens: 502)."""
    from deploys.endpoint import CLOSED_DIR, RETRY_AFTER_S, closed_flag_path, retry_hint_path

    import tempfile

    cfg = validate_hosts(node_a(**_files(lab)))["node-a"]
    root = nginx_root(tmp_path, cfg)
    flag_dir = tempfile.mkdtemp(prefix="inference-nodes-closed-")  # nginx's workers (www-data) look into it, as on
    os.chmod(flag_dir, 0o755)                                        # the node: not under pytest's 0700 folder
    conf = (root / "nginx.conf").read_text()
    assert CLOSED_DIR + "/" in conf
    (root / "nginx.conf").write_text(conf.replace(CLOSED_DIR + "/", flag_dir + "/"))
    flag = closed_flag_path(cfg).replace(CLOSED_DIR, flag_dir)
    hint = retry_hint_path(cfg, 15).replace(CLOSED_DIR, flag_dir)
    key = next(k for n, k in read_clients(cfg.endpoint_clients_file).items() if n != cfg.endpoint_metrics_client)
    (tmp_path / "auth").write_text(f"Authorization: Bearer {key}\n")
    os.chmod(tmp_path / "auth", 0o600)
    url = f"https://{cfg.endpoint_address}:{cfg.endpoint_port}/v1/chat/completions"
    door = f"http://{cfg.api_bind_address}:{cfg.api_port}/v1/completions"
    curl = (f'curl -s -D - --cacert {cfg.endpoint_tls_ca} -X POST -d {{}} -H "Content-Type: application/json" '
            f'-H @{tmp_path / "auth"} {url}')
    script = (f'"$1" -p "$2" -e stderr -c "$2/nginx.conf" & pid=$!; for i in $(seq 50); do curl -s -o /dev/null '
              f'--cacert {cfg.endpoint_tls_ca} https://{cfg.endpoint_address}:{cfg.endpoint_port}/ && break; sleep 0.1; '
              f'done; mkdir -p $(dirname {flag}); touch {flag}; echo "==closed"; {curl}; echo; echo "==anonymous"; '
              f'curl -s -o /dev/null -w "%{{http_code}}" --cacert {cfg.endpoint_tls_ca} -X POST {url}; echo; '
              f'touch {hint}; echo "==hinted"; {curl}; echo; echo "==door"; curl -s -D - -X POST -d {{}} {door}; echo; '
              f'rm -f {flag}; echo "==open"; {curl}; echo; kill $pid; wait $pid 2>/dev/null; true')
    out = in_own_network(cfg, script, nginx, str(root))
    closed, rest = out.stdout.split("==closed", 1)[1].split("==anonymous", 1)
    anonymous, rest = rest.split("==hinted", 1)
    hinted, rest = rest.split("==door", 1)
    at_door, opened = rest.split("==open", 1)
    for answer, told in ((closed, RETRY_AFTER_S), (hinted, 15), (at_door, 15)):
        head, _, body = answer.strip().partition("\n\n")  # (text mode: CRLF read as LF)
        assert head.startswith("HTTP/1.1 503"), out.stdout + out.stderr
        assert f"Retry-After: {told}\n" in head + "\n" and "Content-Type: application/json" in head, head
        error = json.loads(body)["error"]
        assert error["type"] == "service_unavailable" and error["code"] == 503 and error["message"]
    assert anonymous.strip() == "401"
    assert opened.strip().startswith("HTTP/1.1 502"), opened
    assert key not in out.stdout + out.stderr
    shutil.rmtree(flag_dir)


def test_every_refusal_of_the_endpoint_is_an_openai_style_json_error(nginx, lab, tmp_path):
    """The real nginx with the rendered configuration (no vLLM behind it): no key 401 (WWW-Authenticate), a wrong
    method 405 (Allow), a path off the list 404, a body over endpoint_max_body_mb 413, beyond the key's rate 429
    (Retry-After), vLLM unreachable 502 (Retry-After): each `{"error": {"message", "type", "code"}}`."""
    cfg = validate_hosts(node_a(**_files(lab), endpoint_max_body_mb=1, endpoint_rate_per_minute=1,
                                endpoint_rate_burst=1))["node-a"]
    root = nginx_root(tmp_path, cfg)
    key = next(k for n, k in read_clients(cfg.endpoint_clients_file).items() if n != cfg.endpoint_metrics_client)
    (tmp_path / "auth").write_text(f"Authorization: Bearer {key}\n")
    os.chmod(tmp_path / "auth", 0o600)
    (tmp_path / "big.json").write_text('{"x": "' + "a" * (2 * 2**20) + '"}')
    base = f"https://{cfg.endpoint_address}:{cfg.endpoint_port}"
    curl = f"curl -s -D - --cacert {cfg.endpoint_tls_ca}"
    auth = f"-H @{tmp_path / 'auth'}"
    asks = {
        "no key": f"{curl} -X POST -d {{}} {base}/v1/chat/completions",
        "wrong method": f"{curl} {auth} -X GET {base}/v1/chat/completions",
        "off the list": f"{curl} {auth} -X POST -d {{}} {base}/v1/fine_tuning/jobs",
        "too large": f"{curl} {auth} -X POST --data-binary @{tmp_path / 'big.json'} {base}/v1/completions",
        "unreachable": f"{curl} {auth} -X POST -d {{}} {base}/v1/completions",
        "over its rate": f"curl -s -o /dev/null --cacert {cfg.endpoint_tls_ca} {auth} -X POST -d {{}} "
                         f"{base}/v1/completions; "  # the burst's one
                         f"{curl} {auth} -X POST -d {{}} {base}/v1/completions",
    }
    body = " ".join(f'echo "=={name}"; {cmd}; echo;' for name, cmd in asks.items())
    script = (f'"$1" -p "$2" -e stderr -c "$2/nginx.conf" & pid=$!; for i in $(seq 50); do curl -s -o /dev/null '
              f'--cacert {cfg.endpoint_tls_ca} {base}/ && break; sleep 0.1; done; {body} kill $pid; wait $pid; true')
    out = in_own_network(cfg, script, nginx, str(root))
    answers = {}
    for part in out.stdout.split("==")[1:]:
        name, _, rest = part.partition("\n")
        head, _, text = rest.strip().partition("\n\n")
        answers[name] = (int(head.split()[1]), head, json.loads(text)["error"])
    expect = {"no key": (401, "WWW-Authenticate: Bearer", "authentication_error"),
              "wrong method": (405, "Allow: POST", "invalid_request_error"),
              "off the list": (404, "", "not_found_error"),
              "too large": (413, "", "invalid_request_error"),
              "unreachable": (502, "Retry-After: 30", "service_unavailable"),
              "over its rate": (429, "Retry-After: 30", "rate_limit_error")}
    for name, (status, header, kind) in expect.items():
        got, head, error = answers[name]
        assert got == status and header in head and "Content-Type: application/json" in head, (name, head)
        assert error["type"] == kind and error["code"] == status and error["message"], (name, error)
    assert key not in out.stdout + out.stderr


SLOW_VLLM = """
import http.server, sys, time
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        time.sleep(3)
        body = b'{"choices": []}'
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_a_key_holds_at_most_its_concurrency_and_an_address_without_a_key_is_limited(nginx, lab, tmp_path):
    """The real nginx in front of a slow stand-in of vLLM: with profile A's default endpoint_key_concurrency (1: one
    below the 2 sequences its engine runs), four requests of one key at once get one answer and three JSON 429s; requests without a key beyond endpoint_anonymous_per_minute (and its
    burst of 10) get 429 instead of 401 (a `return 401` would have answered before any limit)."""
    cfg = validate_hosts(node_a(**_files(lab), endpoint_anonymous_per_minute=1))["node-a"]
    assert cfg.key_concurrency == 1
    root = nginx_root(tmp_path, cfg)
    key = next(k for n, k in read_clients(cfg.endpoint_clients_file).items() if n != cfg.endpoint_metrics_client)
    (tmp_path / "auth").write_text(f"Authorization: Bearer {key}\n")
    os.chmod(tmp_path / "auth", 0o600)
    (tmp_path / "vllm.py").write_text(SLOW_VLLM)
    base = f"https://{cfg.endpoint_address}:{cfg.endpoint_port}"
    code = f"curl -s -o /dev/null -w '%{{http_code}}\\n' --cacert {cfg.endpoint_tls_ca} -X POST -d {{}}"
    script = (f'python3 {tmp_path / "vllm.py"} {cfg.engine_port} & v=$!; "$1" -p "$2" -e stderr -c "$2/nginx.conf" & '
              f'pid=$!; for i in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:{cfg.engine_port}/ && '
              f'curl -s -o /dev/null --cacert {cfg.endpoint_tls_ca} {base}/ && break; sleep 0.1; done; echo "==key"; for i in 1 2 3 4; do {code} -H @{tmp_path / "auth"} '
              f'{base}/v1/completions > {tmp_path}/k$i & done; wait %3 %4 %5 %6 2>/dev/null; sleep 4; cat {tmp_path}/k*; '
              f'echo "==anonymous"; for i in $(seq 14); do {code} {base}/v1/completions; done; '
              f'kill $pid $v; wait $pid 2>/dev/null; true')
    out = in_own_network(cfg, script, nginx, str(root))
    keyed = out.stdout.split("==key", 1)[1].split("==anonymous", 1)[0].split()
    anonymous = out.stdout.split("==anonymous", 1)[1].split()
    assert sorted(keyed) == ["200", "429", "429", "429"], out.stdout + out.stderr
    assert anonymous[:11] == ["401"] * 11 and set(anonymous[11:]) == {"429"}, anonymous

"""Audit of each head's door and of the authenticated TLS endpoint (deploys/endpoint.py). The door runs on every
head (and nowhere else), on the clients' API port, open, in front of vLLM. The endpoint, where a head has one, from
the control node exactly as a client reaches it: TLS verified against the inventory's CA, bearer keys from the
clients file. It serves the allowed routes to a valid key and refuses everything else; vLLM and everything else on
the head stay on loopback; no client key shows in a process listing or the access log."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys

import pytest
import requests

from deploys.monitoring.node import EXPORTER
from deploys.endpoint import ACCESS_LOG, UNIT, closed_flag_path, endpoint_url, url_host
from deploys.schema.control_readers import read_clients
from deploys.service.unit import served_model_name


@pytest.fixture
def endpoint_node(node, head_only):
    if not node.cfg.endpoint_enabled:
        pytest.skip(f"{node.name}: endpoint_enabled is off (the API is on loopback only)")
    return node


@pytest.fixture
def serving_endpoint(endpoint_node, readiness):
    """A head with an endpoint, once its service answers /health (as every serving check: conftest.py
    `serving_node`): what goes through the endpoint to vLLM needs vLLM up; a service that is down fails at once."""
    ok, why = readiness(endpoint_node)
    if not ok:
        pytest.fail(why, pytrace=False)
    return endpoint_node


def _clients(node) -> tuple[str, str | None]:
    """A client's key and the monitoring client's (None without one)."""
    clients = read_clients(node.cfg.endpoint_clients_file)
    monitor = node.cfg.endpoint_metrics_client
    return next(k for n, k in clients.items() if n != monitor), clients.get(monitor) if monitor else None


def _status(node, path: str, key: str | None = None, method: str = "GET") -> int:
    """The status of a request with ``key`` (kept out of any assertion's output)."""
    return _get(node, path, key, method).status_code


def _get(node, path: str, key: str | None = None, method: str = "GET", **kw) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.request(method, endpoint_url(node.cfg) + path, headers=headers, timeout=30,
                            verify=node.cfg.endpoint_tls_ca or True, **kw)


def test_the_door_runs_on_every_head_and_nowhere_else(node):
    service = node.host.service(f"{UNIT}.service")
    if node.cfg.is_head:
        assert service.is_running and service.is_enabled, f"{node.name}: {UNIT}.service is not running and enabled"
    else:
        assert not service.is_running, f"{node.name}: {UNIT}.service runs on a worker (it serves no API)"


def test_the_door_on_the_clients_port_is_nginx_and_open_in_front_of_vllm(node, head_only, readiness):
    """On the clients' own address and port: the door's nginx (vLLM itself listens on engine_port), not closed
    (no switch runs now), and what it passes on is vLLM's answer (the served model's name)."""
    cfg = node.cfg
    door = [(a, p, proc, cg) for a, p, proc, cg in _listeners(node) if p == cfg.api_port and a == cfg.api_bind_address]
    assert door and all(proc == "nginx" and f"/{UNIT}.service" in cg for _, _, proc, cg in door), \
        f"{node.name}: on {cfg.api_bind_address}:{cfg.api_port}: {[(proc, cg) for _, _, proc, cg in door]}"
    assert not node.host.file(closed_flag_path(cfg)).exists, f"{node.name}: the door is closed and no switch runs"
    ok, why = readiness(node)
    if not ok:
        pytest.fail(why, pytrace=False)
    url = f"http://{url_host(cfg.api_bind_address)}:{cfg.api_port}/v1/models"
    out = node.host.run(f"curl -s -w '\\n%{{http_code}}' {url}")
    body, _, status = out.stdout.rpartition("\n")
    assert status == "200" and served_model_name(cfg) in body, f"{node.name}: {url} through the door: {status}"


def test_the_endpoint_serves_a_client_key_over_verified_tls(serving_endpoint):
    endpoint_node = serving_endpoint
    key, _ = _clients(endpoint_node)
    models = _get(endpoint_node, "/v1/models", key)
    assert models.status_code == 200, f"{endpoint_node.name}: /v1/models through the endpoint: {models.status_code}"
    assert served_model_name(endpoint_node.cfg) in [m["id"] for m in models.json()["data"]]
    status = _status(endpoint_node, "/health", key)
    assert status == 200


def test_the_endpoint_refuses_no_key_a_wrong_key_and_paths_off_its_list(serving_endpoint):
    endpoint_node = serving_endpoint
    key, monitor = _clients(endpoint_node)
    status = _status(endpoint_node, "/v1/models")
    assert status == 401, "no key"
    status = _status(endpoint_node, "/v1/models", "x" * 43)
    assert status == 401, "a wrong key"
    allowed = set(endpoint_node.cfg.endpoint_routes)
    for path in ("/invocations", "/tokenize", "/pause", "/update_weights", "/docs", "/v1/../metrics"):
        if path not in allowed:
            status = _status(endpoint_node, path, key, method="POST")
            assert status in (401, 403, 404), path
    status = _status(endpoint_node, "/metrics", key)
    assert status == 401, "/metrics with a client key"
    if monitor:
        metrics = _get(endpoint_node, "/metrics", monitor)
        assert metrics.status_code == 200 and "vllm:" in metrics.text, "/metrics with the monitoring key"
        status = _status(endpoint_node, "/v1/models", monitor)
        assert status == 401, "the monitoring key used for inference"


@pytest.mark.serving
def test_serving_gate_through_the_endpoint(serving_endpoint):
    """The serving gate's dialogues from the control node through the endpoint, as a client sends them."""
    endpoint_node = serving_endpoint
    key, monitor = _clients(endpoint_node)
    gate = os.path.join(os.path.dirname(__file__), "..", "..", "files", "serving_gate", "serving_gate.py")
    env = {**os.environ, "SERVING_GATE_API_KEY": key, **({"SERVING_GATE_METRICS_KEY": monitor} if monitor else {})}
    args = [sys.executable, gate, endpoint_url(endpoint_node.cfg), served_model_name(endpoint_node.cfg)]
    if endpoint_node.cfg.endpoint_tls_ca:
        args += ["--cacert", endpoint_node.cfg.endpoint_tls_ca]
    result = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    failed = [line for line in result.stdout.splitlines() if '"ok": false' in line]
    assert result.returncode == 0 and not failed, f"{endpoint_node.name}: {failed or result.stderr[-2000:]}"


def _listeners(node) -> list[tuple[str, int, str, str]]:
    """(address, port, process, its cgroup) of every TCP listener a process of this node owns (`ss -p` names only
    the node's own: nodes that share a network namespace see each other's sockets without a process)."""
    out = node.host.check_output("ss -Hltnp")
    found = []
    for line in out.splitlines():
        words = line.split()
        if len(words) < 6 or "users:((" not in line:
            continue
        address, _, port = words[3].rpartition(":")
        address = "::" if address == "*" else address  # ss: every address
        owner = line.split('users:(("', 1)[1]
        pid = owner.split("pid=", 1)[1].split(",", 1)[0]
        cgroup = node.host.run(f"cat /proc/{pid}/cgroup").stdout.strip()
        found.append((address.strip("[]").split("%")[0], int(port), owner.split('"', 1)[0], cgroup))
    return found


def test_nothing_on_the_node_listens_beyond_loopback_but_ssh_the_endpoint_the_exporter_and_the_engine(node):
    """Beyond loopback (and the endpoint's own address, which stands for the LAN even where it is a loopback one):
    sshd, the endpoint on its address and port, node-exporter on `node_exporter_address` and its port, and the
    engine's ranks reaching each other (torch's rendezvous store binds every address and has no option not to;
    vLLM's API itself must be on loopback: its port and the door's are never one of those)."""
    endpoint = (node.cfg.endpoint_address, node.cfg.endpoint_port) if node.cfg.endpoint_enabled else None
    exporter = ((node.cfg.node_exporter_address, node.cfg.node_exporter_port)
                if node.cfg.monitoring_enabled and node.cfg.node_exporter_address else None)
    service = f"/{node.cfg.container_name}.service/"
    wrong = []
    for address, port, process, cgroup in _listeners(node):
        if endpoint and (address, port) == endpoint and process == "nginx" and f"/{UNIT}.service" in cgroup:
            continue
        if exporter and (address, port) == exporter and f"/{EXPORTER}.service" in cgroup:
            continue
        if process == "sshd" or (process == "systemd" and port == 22):  # (Ubuntu 24.04: ssh.socket's listener)
            continue
        ip = ipaddress.ip_address(address)
        if not ip.is_unspecified and ip.is_loopback and not (endpoint and address == endpoint[0]):
            continue
        if service in cgroup and port not in (node.cfg.engine_port, node.cfg.api_port):
            continue
        wrong.append(f"{process} on {address}:{port}")
    assert not wrong, f"{node.name}: listening beyond loopback where the inventory says nothing: {', '.join(wrong)}"


def test_no_client_key_shows_in_a_process_listing_or_the_access_log(endpoint_node):
    keys = list(read_clients(endpoint_node.cfg.endpoint_clients_file).values())
    listing = endpoint_node.host.check_output("ps -eo args")
    found = sum(k in listing for k in keys)  # a count: the assertion never shows a key
    assert found == 0, f"{endpoint_node.name}: a client key in the process listing"
    log = endpoint_node.host.run(f"cat {ACCESS_LOG}").stdout
    found = sum(k in log for k in keys)
    assert found == 0, f"{endpoint_node.name}: a client key in {ACCESS_LOG}"

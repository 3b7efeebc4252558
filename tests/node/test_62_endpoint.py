"""The authenticated TLS endpoint on a sandbox head (real nginx from Debian, real vLLM behind it): a client on this
machine reaches sandbox-a through it exactly as a LAN client would (TLS verified against the sandbox's lab CA,
bearer keys), streams arrive as they are produced, keys rotate by a converge without cutting a running stream,
and the audit fails when the endpoint is down, when something else listens beyond loopback, or when a key shows
in a process listing. sandbox-b0's cluster has no endpoint: nothing of it is on its head."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
import requests

from deploys.endpoint import UNIT, endpoint_url
from deploys.schema.control_readers import read_clients
from deploys.inventory import inventory_configs, load_inventory
from tests.node.conftest import INVENTORY, on_node, pyinfra, restored_afterwards, wait_serving

pytestmark = pytest.mark.endpoint  # the node tier's subject (`make test-fast SUBJECT=endpoint`)

HEAD = "sandbox-a"
AUDIT = [sys.executable, "-m", "pytest", "-q", "-rA", "tests/audit/test_endpoint.py", "--inventory", INVENTORY]


def _cfg():
    return inventory_configs(load_inventory(INVENTORY))[HEAD]


def _keys(cfg) -> dict[str, str]:
    return read_clients(cfg.endpoint_clients_file)


def _status(cfg, key: str | None, body: dict) -> int:
    """The status of a request with ``key`` (kept out of any assertion's output)."""
    return _post(cfg, key, body).status_code


def _post(cfg, key: str | None, body: dict, **kw) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.post(endpoint_url(cfg) + "/v1/chat/completions", json=body, headers=headers, timeout=600,
                         verify=cfg.endpoint_tls_ca, **kw)


def _chat(max_tokens: int, stream: bool = False) -> dict:
    return {"model": "grandpa", "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream,
            **({"stream_options": {"include_usage": True}} if stream else {})}


def _audit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*AUDIT, *args], capture_output=True, text=True, timeout=900)


def test_the_serving_gate_passes_through_the_endpoint_with_tls_verified(sandbox):
    wait_serving([HEAD])
    cfg = _cfg()
    assert cfg.endpoint_enabled and cfg.endpoint_address == "127.0.0.2"
    listen = on_node(HEAD, f"ss -Hltnp 'sport = :{cfg.endpoint_port}'").stdout
    assert f"127.0.0.2:{cfg.endpoint_port}" in listen and "nginx" in listen, listen
    audit = _audit("-m", "serving or not serving")
    assert audit.returncode == 0, audit.stdout[-4000:]
    assert f"PASSED tests/audit/test_endpoint.py::test_serving_gate_through_the_endpoint[{HEAD}]" in audit.stdout
    assert "SKIPPED" in audit.stdout and "endpoint_enabled is off" in audit.stdout  # sandbox-b0: no endpoint
    assert on_node("sandbox-b0", f"systemctl is-active {UNIT}.service").stdout.strip() == "active"  # its door
    door = {line.split()[3] for line in on_node("sandbox-b0", "ss -Hltnp").stdout.splitlines() if '"nginx"' in line}
    assert door == {"127.0.0.1:8102"}, door  # the loopback door alone: no TLS listener without an endpoint
    assert on_node(HEAD, "systemctl is-enabled nginx.service").stdout.strip() == "masked"
    # no certificate check: refused (the CA is the lab's own; clients verify against it)
    try:
        requests.get(endpoint_url(cfg) + "/health", timeout=10)
        raise AssertionError("a client that trusts only the system's CAs accepted the lab certificate")
    except requests.exceptions.SSLError:
        pass


def test_a_stream_arrives_in_pieces_while_it_is_generated(sandbox):
    """Buffering off: server-sent events reach the client as vLLM produces them, not all at once at the end."""
    cfg = _cfg()
    key = _keys(cfg)["demo"]
    t0 = time.monotonic()
    arrivals = []
    with _post(cfg, key, _chat(256, stream=True), stream=True) as r:
        assert r.status_code == 200, r.text[:500]
        for piece in r.iter_content(chunk_size=None):
            arrivals.append((time.monotonic() - t0, piece))
    total = arrivals[-1][0]
    first_data = next(t for t, piece in arrivals if b"data:" in piece)
    assert len(arrivals) > 10, f"{len(arrivals)} pieces: the stream came in one block"
    assert first_data < 0.5 * total, f"first token at {first_data:.2f} s of {total:.2f} s: buffered until the end"
    usage = [json.loads(line[5:]) for t, p in arrivals for line in p.decode().splitlines()
             if line.startswith("data: {") and '"usage"' in line and '"completion_tokens"' in line]
    assert usage and usage[-1]["usage"]["completion_tokens"] == 256


def test_a_key_rotated_by_a_converge_works_the_old_fails_and_a_running_stream_completes(sandbox, tmp_path):
    cfg = _cfg()
    clients = cfg.endpoint_clients_file
    saved = open(clients).read()
    old = _keys(cfg)["demo"]
    new = "rotated-" + "k" * 40
    tokens = 800  # ~80 s at the sandbox's ~10 tokens/s: it outlives the converge (about 30 s) with room
    result: dict = {}

    def stream():
        pieces, t0 = 0, time.monotonic()
        with _post(cfg, old, _chat(tokens, stream=True), stream=True) as r:
            result["status"] = r.status_code
            for piece in r.iter_content(chunk_size=None):
                pieces += 1
                if pieces == 1:
                    result["started"] = time.monotonic()
                result.setdefault("text", []).append(piece.decode(errors="replace"))
        result["ended"] = time.monotonic()
        result["s"] = result["ended"] - t0

    try:
        with restored_afterwards(clients):  # a kill here leaves the next run's key file as it was
            thread = threading.Thread(target=stream)
            thread.start()
            for _ in range(600):
                if "started" in result:
                    break
                time.sleep(0.05)
            with open(clients, "w") as f:
                f.write(saved.replace(old, new))
            proc = pyinfra(INVENTORY, "deploys/all.py", "--limit", HEAD)
            reloaded = time.monotonic()
            assert "Reload the endpoint after a change of keys" in proc.stderr
            leaked = new in proc.stdout + proc.stderr or old in proc.stdout + proc.stderr
            assert not leaked, "a key in pyinfra's output"
            old_status, busy_status = _status(cfg, old, _chat(4)), _status(cfg, new, _chat(4))
            assert old_status == 401, f"the old key still works ({old_status})"
            # the client's one request in flight (endpoint_key_concurrency: one below the engine's 2 sequences) is
            # the old key's stream: its new key waits its turn, the engine's other sequence stays for other clients
            assert busy_status == 429, f"a second request of one client while its stream runs: {busy_status}"
            thread.join(timeout=600)
            new_status = _status(cfg, new, _chat(4))
            assert new_status == 200, f"the new key does not work ({new_status})"
            assert result.get("status") == 200, result.get("status")
            assert result["ended"] > reloaded, (f"the stream ended ({result['s']:.1f} s) before the reload: it shows "
                                                "nothing; raise its max_tokens")
            text = "".join(result["text"])
            assert text.rstrip().endswith("data: [DONE]"), text[-300:]
            usage = [json.loads(line[5:]) for line in text.splitlines()
                     if line.startswith("data: {") and '"usage"' in line and '"completion_tokens"' in line]
            assert usage[-1]["usage"]["completion_tokens"] == tokens, "the stream was cut"
    finally:
        pyinfra(INVENTORY, "deploys/all.py", "--limit", HEAD)
    status = _status(cfg, old, _chat(4))
    assert status == 200, status


def test_the_audit_fails_when_the_endpoint_is_down_something_else_listens_or_a_key_shows(sandbox):
    cfg = _cfg()
    key = _keys(cfg)["demo"]
    assert _audit().returncode == 0
    try:
        on_node(HEAD, f"systemctl stop {UNIT}.service")
        down = _audit()
        assert down.returncode != 0 and f"FAILED tests/audit/test_endpoint.py::test_the_endpoint_serves_a_client_key_over_verified_tls[{HEAD}]" in down.stdout, down.stdout[-3000:]
    finally:
        on_node(HEAD, f"systemctl start {UNIT}.service")
    try:  # vLLM's own port answered beyond loopback (a listener in the service's container, on the address that
        # stands for the LAN), and something else listening there
        on_node(HEAD, "podman exec -d grandpa python3 -m http.server -b 127.0.0.2 18101")
        on_node(HEAD, "systemd-run --unit=inference-nodes-test-stray python3 -m http.server -b 127.0.0.2 9998")
        time.sleep(3)
        stray = _audit("-k", "beyond_loopback")
        assert stray.returncode != 0, stray.stdout[-3000:]
        assert "on 127.0.0.2:18101" in stray.stdout and "python3 on 127.0.0.2:9998" in stray.stdout, stray.stdout[-3000:]
        api = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "tests/audit/test_inference_service.py",
                              "--inventory", INVENTORY, "-k", "api_listens"], capture_output=True, text=True, timeout=300)
        assert f"FAILED tests/audit/test_inference_service.py::test_api_listens_where_the_inventory_says_and_nowhere_else[{HEAD}]" in api.stdout, api.stdout[-3000:]
    finally:
        on_node(HEAD, "pkill -f 'http.server -b 127.0.0.2 18101'")  # from the node: the image may have no pkill
        on_node(HEAD, "systemctl stop inference-nodes-test-stray.service")
    try:
        on_node(HEAD, f"systemd-run --unit=inference-nodes-test-leak sh -c 'sleep 600' leak {key}")
        leak = _audit("-k", "process_listing")
        assert leak.returncode != 0 and "a client key in the process listing" in leak.stdout, leak.stdout[-3000:]
        printed = key in leak.stdout + leak.stderr
        assert not printed, "the audit printed the key it found"
    finally:
        on_node(HEAD, "systemctl stop inference-nodes-test-leak.service")
    time.sleep(1)
    again = _audit()
    assert again.returncode == 0, again.stdout[-3000:]


def test_an_endpoint_turned_off_leaves_only_the_loopback_door(sandbox, tmp_path):
    """Off, the TLS listener and every key leave the head; its door on the clients' loopback port stays (every head
    has one) and passes the API on, and the service is not restarted for it."""
    from tests.node.conftest import inventory_copy

    off = inventory_copy(tmp_path, ('**_endpoint("127.0.0.2", 8441)', 'endpoint_enabled=False'))
    pid = on_node(HEAD, "systemctl show -p MainPID --value grandpa.service").stdout
    try:
        pyinfra(off, "deploys/all.py", "--limit", HEAD)
        assert on_node(HEAD, f"systemctl is-active {UNIT}.service").stdout.strip() == "active"
        assert on_node(HEAD, "ss -Hltn 'sport = :8441'").stdout.strip() == ""
        assert on_node(HEAD, "ls /etc/inference-nodes/endpoint 2>/dev/null").stdout.split() == ["nginx.conf"]
        door = on_node(HEAD, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8101/v1/models").stdout
        assert door == "200", door
        assert on_node(HEAD, "systemctl show -p MainPID --value grandpa.service").stdout == pid
    finally:
        pyinfra(INVENTORY, "deploys/all.py", "--limit", HEAD)
    cfg = _cfg()
    status = _status(cfg, _keys(cfg)["demo"], _chat(4))
    assert status == 200, status


def test_requests_spaced_at_vllms_idle_limit_never_get_a_502(sandbox):
    """vLLM (uvicorn) closes an idle connection after 5 s; nginx keeps its idle upstream connections 4 s, so a request
    that comes as vLLM closes one never lands on it (with nginx's default 60 s: an occasional 502)."""
    cfg = _cfg()
    key = _keys(cfg)["demo"]
    statuses = []
    for _ in range(8):
        statuses.append(_status(cfg, key, _chat(4)))
        time.sleep(5.0)
    assert statuses == [200] * 8, statuses


def _docs_snippet() -> str:
    """The OpenAI client block of docs/endpoint.md, as a reader copies it."""
    text = open("docs/endpoint.md").read()
    block = text.split("(tests/node/test_62_endpoint.py)", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    return "\n".join(line[3:] if line.startswith("   ") else line for line in block.splitlines())


def test_the_official_openai_client_of_the_docs_chats_streams_and_reads_a_refusal(sandbox, tmp_path):
    """The docs' snippet run as written (the sandbox's address, key file and CA put in), then the same client streams,
    and a wrong key raises the client's own AuthenticationError carrying the endpoint's JSON message."""
    import contextlib
    import io
    import os
    import ssl

    import openai

    cfg = _cfg()
    (tmp_path / "workstation.key").write_text(_keys(cfg)["demo"] + "\n")
    os.chmod(tmp_path / "workstation.key", 0o600)
    snippet = (_docs_snippet().replace("https://compute.home.arpa:8000/v1", endpoint_url(cfg) + "/v1")
               .replace('"workstation.key"', repr(str(tmp_path / "workstation.key")))
               .replace('cafile="ca.crt"', f"cafile={cfg.endpoint_tls_ca!r}")
               .replace('"Hello"', '"What is the capital of France?"'))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(snippet, "docs/endpoint.md", "exec"), {})  # noqa: S102 - the docs' own block, on purpose
    assert "Paris" in printed.getvalue(), printed.getvalue()
    tls = ssl.create_default_context(cafile=cfg.endpoint_tls_ca)
    client = openai.OpenAI(base_url=endpoint_url(cfg) + "/v1", api_key=_keys(cfg)["demo"],
                           http_client=openai.DefaultHttpx2Client(verify=tls))
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="grandpa", messages=[{"role": "user", "content": "What is the capital of France?"}], stream=True,
        max_tokens=16) if c.choices]
    assert len(pieces) > 1 and "Paris" in "".join(pieces), pieces
    wrong = openai.OpenAI(base_url=endpoint_url(cfg) + "/v1", api_key="x" * 43, max_retries=0,
                          http_client=openai.DefaultHttpx2Client(verify=tls))
    try:
        wrong.models.list()
        raise AssertionError("a wrong key was served")
    except openai.AuthenticationError as e:
        assert e.status_code == 401 and "a valid API key is required" in str(e), str(e)

"""The serving gate against the stand-in server: a good server passes every check, one that answers
HTTP 200 with garbage fails the coherence (and the other content) checks."""

import json
import os
import socket
import subprocess
import sys

import pytest

GATE = "files/serving_gate/serving_gate.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(params=["good", "garbage"])
def server(request):
    port = _free_port()
    env = {**os.environ, "INFERENCE_API_PORT": str(port), "SERVED_MODEL_NAME": "grandpa", "STANDIN_MODE": request.param}
    proc = subprocess.Popen([sys.executable, "tests/sandbox/standin_server.py"], env=env, stdout=subprocess.PIPE)
    proc.stdout.readline()  # "stand-in inference server ... on ..." once it listens
    yield request.param, f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=10)


def test_gate_passes_a_good_server_and_fails_garbage(server):
    mode, url = server
    proc = subprocess.run([sys.executable, GATE, url, "grandpa"], capture_output=True, text=True, timeout=60)
    results = {r["check"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert set(results) == {"health", "models", "coherence", "usage", "metrics", "tool_round_trip", "strict_json"}
    if mode == "good":
        assert proc.returncode == 0, results
        assert all(r["ok"] for r in results.values())
    else:
        assert proc.returncode == 1
        assert results["health"]["ok"] and results["models"]["ok"], "a garbage server still answers 200"
        assert not results["coherence"]["ok"] and "Paris" not in results["coherence"]["detail"]
        assert not results["tool_round_trip"]["ok"] and not results["strict_json"]["ok"]


def test_unknown_model_name_fails_the_models_check(server):
    mode, url = server
    if mode != "good":
        pytest.skip("one mode is enough")
    proc = subprocess.run([sys.executable, GATE, url, "not-served"], capture_output=True, text=True, timeout=60)
    results = {r["check"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert proc.returncode == 1 and not results["models"]["ok"] and "grandpa" in results["models"]["detail"]


def test_gate_reports_an_unreachable_server():
    proc = subprocess.run([sys.executable, GATE, f"http://127.0.0.1:{_free_port()}", "x"], capture_output=True,
                          text=True, timeout=60)
    results = list(map(json.loads, proc.stdout.splitlines()))
    assert proc.returncode == 1 and not any(r["ok"] for r in results)
    assert "Connection refused" in results[0]["detail"] or "URLError" in results[0]["detail"]

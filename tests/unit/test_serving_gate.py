"""The serving gate against the stand-in server: a good server passes every check, one that answers
HTTP 200 with garbage fails the coherence (and the other content) checks; its schemas are closed and
bounded, and its validator covers the keywords they use. (Against a real vLLM with the sandbox's
known-answer model: tests/sandbox/tiny_model.py.)"""

import importlib.util
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


def _gate_module():
    spec = importlib.util.spec_from_file_location("serving_gate", GATE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_structured_request_is_closed_and_bounded():
    """A broken model must still finish: enum / maxLength / integer bounds, no extra keys, bounded max_tokens."""
    gate = _gate_module()
    for schema in (gate.WEATHER_TOOL["function"]["parameters"], gate.CITY_SCHEMA):
        assert schema["additionalProperties"] is False and set(schema["required"]) == set(schema["properties"])
        for prop in schema["properties"].values():
            assert "enum" in prop or "maxLength" in prop or {"minimum", "maximum"} <= set(prop), prop
    assert gate.TOOL_CHOICE == {"type": "function", "function": {"name": "get_weather"}}
    assert 0 < gate.MAX_TOKENS <= 64
    assert gate.TOOL_ARGUMENTS["city"] in gate.WEATHER_TOOL["function"]["parameters"]["properties"]["city"]["enum"]


@pytest.mark.parametrize("value, errors", [
    ({"city": "Paris", "country": "France", "population_millions": 2}, []),
    ({"city": "Paris", "country": "France", "population_millions": 2.5}, ["population_millions: expected integer"]),
    ({"city": "Paris", "country": "France", "population_millions": True}, ["population_millions: expected integer"]),
    ({"city": "Paris", "country": "France", "population_millions": 101}, ["population_millions: 101 > maximum"]),
    ({"city": "Paris", "country": "France", "population_millions": -1}, ["population_millions: -1 < minimum"]),
    ({"city": "P" * 33, "country": "France", "population_millions": 2}, ["city: longer than 32"]),
    ({"city": "Paris", "population_millions": 2}, ["missing country"]),
    ({"city": "Paris", "country": "France", "population_millions": 2, "x": 1}, ["unexpected x"]),
    (["Paris"], ["expected object"]),
])
def test_schema_errors_covers_the_keywords_the_gate_uses(value, errors):
    got = _gate_module().schema_errors(value, _gate_module().CITY_SCHEMA)
    assert len(got) == len(errors) and all(g.startswith(e) for g, e in zip(got, errors)), got


def test_schema_errors_enum():
    gate = _gate_module()
    params = gate.WEATHER_TOOL["function"]["parameters"]
    assert gate.schema_errors({"city": "Paris"}, params) == []
    assert gate.schema_errors({"city": "Lyon"}, params) == [f"city: 'Lyon' not in {params['properties']['city']['enum']}"]


def test_metrics_check_wants_the_v1_names(monkeypatch):
    """A server without vllm:num_requests_running / vllm:kv_cache_usage_perc (e.g. only the old
    gpu_cache_usage_perc) fails the metrics check, naming what is missing."""
    gate = _gate_module()
    generated = [0]

    def fake_call(base, path, body=None, timeout=120):
        if path == "/metrics":
            return 200, f'vllm:generation_tokens_total{{model_name="m"}} {generated[0]}\nvllm:gpu_cache_usage_perc 0.1\n'
        if path == "/v1/models":
            return 200, json.dumps({"data": [{"id": "m"}]})
        if path == "/v1/chat/completions":
            generated[0] += 7
            return 200, json.dumps({"choices": [{"message": {"content": "Paris."}, "finish_reason": "stop"}],
                                    "usage": {"completion_tokens": 7}})
        return 200, ""

    monkeypatch.setattr(gate, "call", fake_call)
    results = {r["check"]: r for r in gate.run_checks("http://x", "m")}
    assert results["coherence"]["ok"] and results["usage"]["ok"]
    assert not results["metrics"]["ok"]
    assert results["metrics"]["detail"] == "/metrics lacks vllm:num_requests_running, vllm:kv_cache_usage_perc"

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

from files.serving_gate.kv_capacity import kv_capacity, kv_capacity_problems
from files.serving_gate.schema_subset import schema_errors
from tests.unit.profiles import profile

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


def test_what_a_head_is_sent_is_all_the_gate_and_needle_need(server, tmp_path):
    """The audits run the gate, and needle.py which imports it, from a private folder on the head (no
    checkout there): node_script's files alone, run from an empty folder with the system python, answer;
    the folder is gone afterwards."""
    from deploys.serving_gate import node_script
    from tests.audit.test_long_context import needle_script, verdict_of

    mode, url = server
    if mode != "good":
        pytest.skip("one mode is enough")
    (tmp_path / "cwd").mkdir()
    (tmp_path / "tmp").mkdir()
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path / "tmp")}

    def on_head(script):
        return subprocess.run(script, shell=True, cwd=tmp_path / "cwd", env=env, capture_output=True, text=True,
                              timeout=60)

    gate = on_head(node_script(f'python3 "$d/serving_gate.py" {url} grandpa\n'))
    checks = [json.loads(line) for line in gate.stdout.splitlines()]
    assert gate.returncode == 0 and len(checks) == 7 and all(c["ok"] for c in checks), gate.stderr or checks
    needle = on_head(needle_script(url, "grandpa", 64))
    verdict = verdict_of(needle.stdout)  # the stand-in counts 8 prompt tokens: a failing verdict, but one
    assert verdict and verdict["check"] == "long_context" and "prompt_tokens 8 < 64" in verdict["detail"], needle.stderr
    assert list((tmp_path / "tmp").iterdir()) == [] and list((tmp_path / "cwd").iterdir()) == []


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
    got = schema_errors(value, _gate_module().CITY_SCHEMA)
    assert len(got) == len(errors) and all(g.startswith(e) for g, e in zip(got, errors)), got


def test_schema_errors_enum():
    gate = _gate_module()
    params = gate.WEATHER_TOOL["function"]["parameters"]
    assert schema_errors({"city": "Paris"}, params) == []
    assert schema_errors({"city": "Lyon"}, params) == [f"city: 'Lyon' not in {params['properties']['city']['enum']}"]


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


# --- seed 004's qualification gates: the parsing and the decisions --------------------------------------

# Seed 000's journal, verbatim (the write-up's startup log of deployment A).
SEED_000_LOG = """\
Aug 04 02:44:21 compute-server grandpa[572062]: (Worker_TP0 pid=264) INFO 08-04 02:44:21 [gpu_worker.py:617] Available KV cache memory: 8.59 GiB
Aug 04 02:44:21 compute-server grandpa[572062]: (EngineCore pid=179) INFO 08-04 02:44:21 [kv_cache_utils.py:2428] GPU KV cache size: 285,336 tokens
Aug 04 02:44:21 compute-server grandpa[572062]: (EngineCore pid=179) INFO 08-04 02:44:21 [kv_cache_utils.py:2429] Maximum concurrency for 262,144 tokens per request: 1.09x
"""
# The sandbox's CPU vLLM 0.21 (`-o cat` journal), two starts: the last one counts.
CPU_LOG = """\
(EngineCore pid=20777) INFO 12-01 09:08:36 [kv_cache_utils.py:1710] GPU KV cache size: 1,000 tokens
(EngineCore pid=20777) INFO 12-01 09:08:36 [kv_cache_utils.py:1711] Maximum concurrency for 512 tokens per request: 1.95x
(EngineCore pid=21140) INFO 12-01 09:09:26 [kv_cache_utils.py:1710] GPU KV cache size: 2,097,152 tokens
(EngineCore pid=21140) INFO 12-01 09:09:26 [kv_cache_utils.py:1711] Maximum concurrency for 2,048 tokens per request: 1024.00x
"""


def test_kv_capacity_reads_the_startup_log_lines():
    assert kv_capacity(SEED_000_LOG) == {"tokens": 285336, "request_tokens": 262144, "concurrency": 1.09}
    assert kv_capacity(CPU_LOG) == {"tokens": 2097152, "request_tokens": 2048, "concurrency": 1024.0}
    assert kv_capacity("Starting vLLM API server\n") == {"tokens": None, "request_tokens": None,
                                                            "concurrency": None}


def test_kv_capacity_against_the_profile_minimums():
    """Deployment A's profile minimums are seed 000's own figures: its log passes, a smaller pool fails,
    naming the figure, the key and the minimum; a log without the lines fails, saying so."""
    a = profile("rtx_pro_6000_pair")
    seed = kv_capacity(SEED_000_LOG)
    assert kv_capacity_problems(seed, a["gate_kv_cache_min_tokens"], a["gate_kv_min_concurrency"]) == []
    smaller = kv_capacity(SEED_000_LOG.replace("285,336", "200,000").replace("1.09x", "0.76x"))
    assert kv_capacity_problems(smaller, a["gate_kv_cache_min_tokens"], a["gate_kv_min_concurrency"]) == [
        "GPU KV cache size 200,000 tokens is below gate_kv_cache_min_tokens 285,336",
        "maximum concurrency 0.76x for 262,144 tokens per request is below gate_kv_min_concurrency 1.09x"]
    missing = kv_capacity_problems(kv_capacity(""), 1, 1.0)
    assert len(missing) == 2 and "no 'GPU KV cache size: N tokens' line" in missing[0]
    assert kv_capacity_problems(kv_capacity(""), None, None) == []  # nothing asked, nothing checked
    b = profile("gb10_dspark")  # seed 004: 1,372,579 tokens, 1.31x the 1,048,576-token context
    assert (b["gate_kv_cache_min_tokens"], b["gate_kv_min_concurrency"]) == (1372579, 1.31)
    assert "--max-model-len" in b["vllm_args"] and b["vllm_args"][b["vllm_args"].index("--max-model-len") + 1] == "1048576"


def _reply(n, text="1 2 3", finish="length"):
    return {"choices": [{"message": {"content": text}, "finish_reason": finish}], "usage": {"completion_tokens": n}}


@pytest.mark.parametrize("samples, replies, generated, min_tok_s, problem", [
    ([(0, 0), (2, 0), (2, 0), (1, 0)], [_reply(100), _reply(100)], 200, 0, None),
    # K above --max-num-seqs: one runs, one waits
    ([(1, 1), (1, 1), (1, 0)], [_reply(100), _reply(100)], 200, 0,
     "vllm:num_requests_running peaked at 1, want 2: not all scheduled together (--max-num-seqs below K?)"),
    ([(2, 1), (2, 0)], [_reply(100), _reply(100)], 200, 0, "vllm:num_requests_waiting reached 1 while they ran"),
    ([(3, 0)], [_reply(100), _reply(100)], 200, 0, "peaked at 3, want 2: other requests were running"),
    ([(0, 0)], [_reply(100), _reply(100)], 200, 0, "no /metrics sample of 1 saw a request running"),
    ([(2, 0)], [_reply(100), _reply(37, finish="stop")], 200, 0,
     "request 2: 37 completion tokens (finish_reason stop), want exactly 100 (length)"),
    ([(2, 0)], [_reply(100), _reply(100, text="other")], 200, 0, "answered 2 different texts"),
    ([(2, 0)], [_reply(100), "URLError: timed out"], 200, 0, "request 2: URLError: timed out"),
    ([(2, 0)], [_reply(100), _reply(100)], 120, 0, "vllm:generation_tokens_total rose by 120, less than the 200"),
    ([(2, 0)], [_reply(100), _reply(100)], 200, 1000, "aggregate 20.00 tok/s is below gate_min_aggregate_tok_s 1000"),
])
def test_concurrency_verdict(samples, replies, generated, min_tok_s, problem):
    ok, detail = _gate_module().concurrency_verdict(2, 100, samples, replies, [8.0, 9.0, 10.0], generated, min_tok_s)
    assert ok is (problem is None), detail
    if problem:
        assert problem in detail, detail
    else:
        assert detail.startswith("2 x 100 tokens in 10.00 s: aggregate 20.00 tok/s, per stream 11.11-12.50 tok/s "
                                 "(usage.completion_tokens); running peak 2, waiting peak 0"), detail


def _scheduler(gate, monkeypatch, max_num_seqs, tokens_out=None):
    """A fake server behind gate.call: requests take 0.6 s once scheduled, at most max_num_seqs at a time;
    /metrics shows the running and waiting counts and the generation counter."""
    import threading
    import time

    state = {"running": 0, "waiting": 0, "generated": 0, "bodies": []}
    lock, slots = threading.Lock(), threading.Semaphore(max_num_seqs)

    def fake_call(base, path, body=None, timeout=120):
        if path == "/metrics":
            with lock:
                return 200, (f"vllm:num_requests_running {state['running']}\nvllm:num_requests_waiting "
                             f"{state['waiting']}\nvllm:generation_tokens_total {state['generated']}\n")
        if path != "/v1/chat/completions":
            return 200, json.dumps({"data": [{"id": "m"}]})
        with lock:
            state["waiting"] += 1
            state["bodies"].append(body)
        with slots:
            with lock:
                state["waiting"] -= 1
                state["running"] += 1
            time.sleep(0.6)
            n = tokens_out or body["max_tokens"]
            with lock:
                state["running"] -= 1
                state["generated"] += n
        return 200, json.dumps(_reply(n, text="1 2 3"))

    monkeypatch.setattr(gate, "call", fake_call)
    return state


def test_concurrency_proof_samples_metrics_while_the_requests_run(monkeypatch):
    gate = _gate_module()
    state = _scheduler(gate, monkeypatch, max_num_seqs=2)
    ok, detail = gate.concurrency_proof("http://x", "m", 2, 64, poll=0.05)
    assert ok, detail
    assert "running peak 2, waiting peak 0" in detail
    body = state["bodies"][0]
    assert body["max_tokens"] == 64 and body["ignore_eos"] is True and body["temperature"] == 0
    assert "stream" not in body, "tokens are counted from usage, never from stream chunks"


def test_concurrency_proof_fails_when_k_exceeds_the_servers_slots(monkeypatch):
    gate = _gate_module()
    _scheduler(gate, monkeypatch, max_num_seqs=2)
    ok, detail = gate.concurrency_proof("http://x", "m", 3, 64, poll=0.05)
    assert not ok
    assert "vllm:num_requests_running peaked at 2, want 3: not all scheduled together" in detail, detail
    assert "vllm:num_requests_waiting reached 1" in detail


def test_concurrency_check_runs_only_when_asked(monkeypatch):
    gate = _gate_module()
    _scheduler(gate, monkeypatch, max_num_seqs=4)
    names = [r["check"] for r in gate.run_checks("http://x", "m")]
    assert "concurrency" not in names
    results = {r["check"]: r for r in gate.run_checks("http://x", "m", concurrency=2, concurrency_tokens=32)}
    assert results["concurrency"]["ok"], results["concurrency"]


def test_wait_ready_names_the_url_after_its_timeout_and_returns_once_healthy(server):
    mode, url = server
    gate = _gate_module()
    assert 0 <= gate.wait_ready(url, 5) < 5
    dead = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(TimeoutError, match=rf"^{dead}/health did not answer 200 in 0.3 s \(last: URLError"):
        gate.wait_ready(dead, 0.3, interval=0.1)
    proc = subprocess.run([sys.executable, GATE, dead, "x", "--wait", "0.3", "--ready-only"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1 and [json.loads(line)["check"] for line in proc.stdout.splitlines()] == ["ready"]


def test_the_profiles_gate_options_and_restart_order():
    from deploys.schema import validate_hosts
    from deploys.serving_gate import gate_options, restart_order

    b = profile("gb10_dspark")
    nodes = {"b0": {**b, "node_rank": 0, "fabric_address": "198.51.100.20"},
             "b1": {**b, "node_rank": 1, "fabric_address": "198.51.100.21"}}
    configs = validate_hosts(nodes)
    assert gate_options(configs["b0"]) == ["--concurrency", "2", "--concurrency-tokens", "1005"]
    assert configs["b0"].gate_restart is True
    assert [n for n, _ in restart_order(list(configs.items()))] == ["b1", "b0"]  # the worker first
    a = validate_hosts({"a": {**profile("rtx_pro_6000_pair"), "ssh_hostname": "192.0.2.10"}})["a"]
    assert gate_options(a) == [] and a.gate_restart is False  # the defaults: no proof, no restart


@pytest.mark.parametrize("key, value, expected", [
    ("gate_concurrency", -1, "greater than or equal to 0"),
    ("gate_concurrency_tokens", 0, "greater than or equal to 8"),
    ("gate_kv_cache_min_tokens", "lots", "valid integer"),
    ("gate_kv_min_concurrency", 0, "greater than 0"),
])
def test_gate_keys_are_typed(key, value, expected):
    from deploys.schema import InventoryValidationError, validate_hosts

    with pytest.raises(InventoryValidationError) as err:
        validate_hosts({"node-a": {**profile("rtx_pro_6000_pair"), "ssh_hostname": "192.0.2.10", key: value}})
    assert f"key '{key}" in str(err.value) and expected in str(err.value)


@pytest.mark.parametrize("extra, key, expected", [
    ({"gate_concurrency": 3}, "gate_concurrency", "at most --max-num-seqs 2 (vllm_args)"),
    ({"gate_concurrency": 2, "gate_concurrency_tokens": 1048576}, "gate_concurrency_tokens",
     "below --max-model-len 1048576"),
    ({"gate_long_context_tokens": 1048570}, "gate_long_context_tokens",
     "at most --max-model-len 1048576 (vllm_args) less the answer's 16 tokens"),
    ({"gate_concurrency": 2, "vllm_args": ["--max_num_seqs", "1"]}, "gate_concurrency",
     "at most --max-num-seqs 1 (vllm_args)"),  # vLLM reads the underscore spelling too
    ({"gate_long_context_tokens": 4096, "vllm_args": ["--max-model-len=4096"]}, "gate_long_context_tokens",
     "at most --max-model-len 4096 (vllm_args)"),
])
def test_a_gate_the_servers_own_limits_would_fail_is_refused(extra, key, expected):
    from deploys.schema import InventoryValidationError, validate_hosts

    b = profile("gb10_dspark")

    def nodes(values: dict) -> dict:
        return {"b0": {**b, "node_rank": 0, "fabric_address": "198.51.100.20", **values},
                "b1": {**b, "node_rank": 1, "fabric_address": "198.51.100.21", **values}}

    with pytest.raises(InventoryValidationError) as err:
        validate_hosts(nodes(extra))
    assert f"host b0: key '{key}'" in str(err.value) and expected in str(err.value)
    # at the limits it is accepted: --max-num-seqs 2 runs 2, the needle fits with its answer
    fits = validate_hosts(nodes({"gate_concurrency": 2, "gate_long_context_tokens": 1048576 - 16}))
    assert fits["b0"].gate_long_context_tokens == 1048560



def _read(active="active", sub="running", restarts="0", invocation="i1", health=0, journal=(), result="success"):
    props = f"ActiveState={active}\nSubState={sub}\nNRestarts={restarts}\nInvocationID={invocation}\nResult={result}\n"
    return (props + "##inference-nodes-readiness:health\n" + f"{health}\n" + "##inference-nodes-readiness:journal\n"
            + "".join(f"{line}\n" for line in journal))


def _cfg(**changes):
    from deploys.schema import NodeConfig

    return NodeConfig.model_validate({**profile("rtx_pro_6000_pair"), **changes})


def _node(reads):
    """A node whose readiness reads are ``reads`` in turn (the last one repeats)."""
    seen = []

    def run(command):
        seen.append(command)
        return reads[min(len(seen), len(reads)) - 1]
    return run, seen


def test_wait_serving_shows_the_stage_and_returns_once_the_head_answers(monkeypatch):
    from deploys import serving_gate

    monkeypatch.setattr(serving_gate.time, "sleep", lambda s: None)
    a = _cfg()
    run, seen = _node([_read("activating", "start-pre"), _read(journal=["Loading safetensors checkpoint shards: 50%"]),
                       _read(journal=["Capturing CUDA graphs (decode)"]), _read(health=200)])
    told = []
    ok, why, last = serving_gate.wait_serving(run, a, True, 600, told.append)
    assert ok and why.startswith("grandpa.service answers /health after") and len(seen) == 4
    assert any("loading weights" in t for t in told) and any("capturing graphs" in t for t in told), told
    assert f"http://127.0.0.1:{a.engine_port}/health" in seen[0]  # vLLM itself, never its door


@pytest.mark.parametrize("reads, says", [
    ([_read(), _read("activating", "auto-restart", result="exit-code", journal=["ValueError: bad gpu_memory_utilization"])],
     "the unit is activating (auto-restart), result exit-code; its journal ends:\nValueError: bad gpu_memory_utilization"),
    ([_read(), _read("failed", "failed", result="exit-code")], "the unit is failed (failed)"),
    ([_read(), _read("inactive", "dead")], "the unit is inactive (dead)"),
    ([_read(), _read(restarts="1", invocation="i2")], "the unit restarted while starting (restarts 0 -> 1"),
])
def test_wait_serving_fails_at_once_on_a_unit_that_is_not_starting(monkeypatch, reads, says):
    from deploys import serving_gate

    monkeypatch.setattr(serving_gate.time, "sleep", lambda s: None)
    run, seen = _node(reads)
    ok, why, _ = serving_gate.wait_serving(run, _cfg(), True, 600)
    assert not ok and len(seen) == 2 and says in why, why


def test_wait_serving_takes_a_start_count_set_back_by_the_backoff_reset_for_no_restart(monkeypatch):
    """CI, a repaired shard: the unit had restarted twice before the converge restarted it (a manual restart keeps
    the count); 30 s into the start the node's backoff reset ran `systemctl reset-failed` (count 2 -> 0, same
    invocation) and the switch had failed the release as 'restarted while starting'."""
    from deploys import serving_gate

    monkeypatch.setattr(serving_gate.time, "sleep", lambda s: None)
    run, seen = _node([_read(restarts="2"), _read(restarts="0"), _read(restarts="0", health=200)])
    ok, why, _ = serving_gate.wait_serving(run, _cfg(), True, 600)
    assert ok and len(seen) == 3, why
    run, seen = _node([_read(restarts="2"), _read(restarts="0"), _read(restarts="1", invocation="i2")])
    ok, why, _ = serving_gate.wait_serving(run, _cfg(), True, 600)
    assert not ok and "the unit restarted while starting (restarts 2 -> 1" in why, why


def test_wait_serving_gives_up_after_its_bound_and_a_worker_needs_no_api(monkeypatch):
    from deploys import serving_gate

    clock = iter(range(0, 10_000, 10))
    monkeypatch.setattr(serving_gate.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(serving_gate.time, "sleep", lambda s: None)
    run, seen = _node([_read(journal=["Loading weights"])])
    ok, why, _ = serving_gate.wait_serving(run, _cfg(), True, 60)
    assert not ok and "did not answer /health within service_ready_timeout_sec=60 s" in why and "Loading weights" in why
    run, seen = _node([_read()])  # a worker: its unit runs; it serves no API
    ok, why, _ = serving_gate.wait_serving(run, _cfg(), False, 60)
    assert ok and "runs after" in why and "echo 0" in seen[0]


def test_the_readiness_read_asks_the_real_api(server):
    """The health part of the read, run by a shell against the stand-in server (systemctl may be missing here)."""
    from deploys.serving_gate import parse_readiness, readiness_command

    mode, url = server
    cfg = _cfg(engine_port=int(url.rsplit(":", 1)[1]))
    out = subprocess.run(["sh", "-c", readiness_command(cfg, True)], capture_output=True, text=True, timeout=60).stdout
    assert parse_readiness(out)["health"] == 200
    cfg = _cfg(engine_port=_free_port())
    out = subprocess.run(["sh", "-c", readiness_command(cfg, True)], capture_output=True, text=True, timeout=60).stdout
    assert parse_readiness(out)["health"] == 0


def test_a_failure_names_the_first_error_when_it_scrolled_off_the_tail():
    from deploys.serving_gate import journal_told

    journal = ["INFO starting", "pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig",
               *[f"noise {i}" for i in range(20)]]
    told = journal_told(journal)
    assert told.startswith("; first error: pydantic_core._pydantic_core.ValidationError: 1 validation error")
    assert told.endswith("noise 19") and "noise 4\n" not in told  # the last 15 lines
    assert journal_told(journal[1:5]).startswith("; its journal ends:\npydantic_core")  # in the tail: said once
    assert journal_told([]) == "; its journal is empty"


def test_the_first_error_is_the_services_own_not_a_warning_that_names_an_error():
    from deploys.serving_gate import first_error, journal_told

    ulimit = "WARNING 12-05 08:00:01 [utils.py:12] soft ulimit for open files is low: error-prone under load"
    journal = ["INFO 12-05 08:00:00 [api_server.py:1] vLLM API server version 0.21", ulimit,
               "(EngineCore_DP0 pid=312) ERROR 12-05 08:00:09 [core.py:700] EngineCore failed to start.",
               "Traceback (most recent call last):", '  File "core.py", line 9, in run',
               "ValueError: Input should be less than or equal to 1", *[f"noise {i}" for i in range(20)]]
    assert first_error(journal) == journal[2]
    assert first_error([ulimit, *journal[3:]]) == "ValueError: Input should be less than or equal to 1"
    assert first_error([ulimit, "Main process exited, code=exited, status=1/FAILURE"]).startswith("Main process")
    assert first_error([ulimit]) is None
    told = journal_told([line + "\n" for x in journal for line in (x, "")])
    assert told.startswith("; first error: (EngineCore_DP0 pid=312) ERROR")
    assert "\n\n" not in told, "one journal line per line"


def test_a_single_node_never_says_it_waits_for_other_nodes():
    from deploys.serving_gate import startup_stage

    journal = ["INFO world_size=2 rank=0 local_rank=0 distributed_init_method=tcp://127.0.0.1:4242"]
    assert startup_stage(journal, multi_node=False) == ""
    assert startup_stage(journal, multi_node=True) == "waiting for the other nodes"
    assert startup_stage(["Loading weights took 3 s", *journal], multi_node=False) == "loading weights"


def test_a_head_stops_waiting_once_a_worker_of_its_job_failed(monkeypatch):
    """A worker whose own switch failed in this run: its head's job cannot form, so the head stops waiting at once
    (not after service_ready_timeout_sec) and says why, for the cluster's rollback."""
    from deploys import serving_gate

    monkeypatch.setattr(serving_gate.time, "sleep", lambda s: None)
    run, seen = _node([_read(journal=["Loading weights"]), _read(journal=["world_size=2 waiting"]), _read(health=200)])
    failed = iter([None, "worker sandbox-b1 failed its switch in this run"])
    ok, why, _ = serving_gate.wait_serving(run, _cfg(), True, 600, abort=lambda: next(failed))
    assert not ok and len(seen) == 2
    assert why.startswith("grandpa.service: worker sandbox-b1 failed its switch in this run"), why

#!/usr/bin/env python3
"""The serving gate: is a running OpenAI-compatible server answering *correctly*, not just with HTTP 200?
Stdlib only; runs on the node (the API stays on loopback) or anywhere that can reach the URL.

    serving_gate.py BASE_URL MODEL_NAME [--wait S] [--concurrency K --concurrency-tokens N
                    [--min-aggregate-tok-s R]]   -> one JSON object per line: {"check", "ok", "detail"}
    serving_gate.py BASE_URL MODEL_NAME --wait S --ready-only    -> only the readiness wait
    SERVING_GATE_API_KEY=... [SERVING_GATE_METRICS_KEY=...] serving_gate.py https://ENDPOINT MODEL --cacert CA
                                                                 -> the same, through an authenticated endpoint

Checks: /health; /v1/models lists MODEL_NAME; coherence at temperature 0 ("capital of France" must say
Paris); a named tool call (get_weather, arguments exactly {"city": "Paris"}) and its tool-result
continuation (must mention 18 and sunny); a strict JSON-schema answer that parses, validates and names
Paris; token counts from usage.completion_tokens (never from stream chunks); vLLM's generation-token counter
rising across a request, and its running-requests and KV-cache gauges present. Exit status 0 only when
every check passed.

Seed 004's qualification gates, selected per profile (deploys/schema/gate.py GateKeys; deploys/serving_gate.py
turns them into these options): `--concurrency K` sends K identical greedy requests at once, each bounded to
exactly N tokens (`max_tokens` + `ignore_eos`), samples /metrics while they run and wants
`vllm:num_requests_running` = K with `vllm:num_requests_waiting` = 0, every reply `finish_reason` "length"
with `usage.completion_tokens` = N and the same text, and reports the decode rate from usage (and checks
`vllm:generation_tokens_total` rose by at least as much). The KV-capacity gate reads the startup log, not
the API: kv_capacity.py beside this file. `wait_ready()` is the one wait for /health that the gate, the
audits, the node tests and the benchmarks use.

Every request is greedy and bounded (MAX_TOKENS, $SERVING_GATE_MAX_TOKENS overrides), and every structured
one has a closed, bounded schema (enum, maxLength, integer bounds, no extra keys): a broken model still
finishes each request quickly, with HTTP 200 and nonsense, and fails on content. The requests are plain
data here (COHERENCE_MESSAGES, TOOL_MESSAGES, tool_result_messages, JSON_MESSAGES, ...) so that the
sandbox's known-answer model (tests/sandbox/tiny_model.py) is trained on exactly what the gate sends.
The strict JSON answer is validated by schema_subset.py, imported from beside this file (run as a file,
this folder is sys.path[0]; loaded by path, as deploys/serving_gate.py, the unit tests and tiny_model.py
do, the gate puts it there first, as needle.py does for this file): wherever the gate runs, it goes along.
"""

import argparse
import json
import os
import re
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from schema_subset import schema_errors  # noqa: E402 - the validator of the strict JSON answer, beside this file

MAX_TOKENS = int(os.environ.get("SERVING_GATE_MAX_TOKENS") or 48)

COHERENCE_MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "London", "Tokyo", "Berlin", "Madrid"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TOOL_CHOICE = {"type": "function", "function": {"name": "get_weather"}}
TOOL_MESSAGES = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
TOOL_ARGUMENTS = {"city": "Paris"}
TOOL_RESULT = "18 C and sunny"

JSON_MESSAGES = [{"role": "user", "content": "Describe Paris as JSON."}]
CITY_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 32},
        "country": {"type": "string", "maxLength": 32},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 100},
    },
    "required": ["city", "country", "population_millions"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True}}

METRICS = ("vllm:generation_tokens_total", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")
WAITING = "vllm:num_requests_waiting"

# The concurrency proof's request (seed 004's "count 1-300, exact bounded output"): its length is fixed by
# max_tokens + ignore_eos, whatever the model answers.
CONCURRENCY_MESSAGES = [{"role": "user", "content": "Count from 1 to 300, separated by spaces."}]


def tool_result_messages(call_id, name, arguments):
    """The continuation after the tool call: the assistant's call as the server returned it (id, name,
    arguments string), then the tool's answer."""
    return TOOL_MESSAGES + [
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": TOOL_RESULT},
    ]


# Through an authenticated endpoint (deploys/endpoint.py), as a client would: TLS verified against --cacert, the
# client's key from $SERVING_GATE_API_KEY and the monitoring client's from $SERVING_GATE_METRICS_KEY (/metrics),
# never from the command line (a process listing shows it). On a head's loopback API: neither.
CLIENT = {"ssl": None, "key": os.environ.get("SERVING_GATE_API_KEY"),
          "metrics_key": os.environ.get("SERVING_GATE_METRICS_KEY")}


def call(base, path, body=None, timeout=120):
    headers = {"Content-Type": "application/json"}
    key = CLIENT["metrics_key"] if path == "/metrics" else CLIENT["key"]
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(base.rstrip("/") + path, method="POST" if body is not None else "GET",
                                 data=json.dumps(body).encode() if body is not None else None, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout, context=CLIENT["ssl"]) as r:
        raw = r.read().decode("utf-8", "replace")
        return r.status, raw


def chat(base, model, messages, timeout=120, **extra):
    status, raw = call(base, "/v1/chat/completions", {"model": model, "messages": messages, "temperature": 0,
                                                       "max_tokens": MAX_TOKENS, **extra}, timeout=timeout)
    return json.loads(raw)


def wait_ready(base, timeout, interval=2.0):
    """Seconds until BASE/health answers 200 (a real vLLM loads and compiles first); TimeoutError naming the
    URL and the last answer after ``timeout`` seconds."""
    t0 = time.monotonic()
    last = "no answer"
    while True:
        try:
            status, _ = call(base, "/health", timeout=5)
            if status == 200:
                return time.monotonic() - t0
            last = f"HTTP {status}"
        except (urllib.error.URLError, OSError, ValueError) as e:
            last = f"{type(e).__name__}: {e}"
        if time.monotonic() - t0 >= timeout:
            raise TimeoutError(f"{base.rstrip('/')}/health did not answer 200 in {timeout:g} s (last: {last})")
        time.sleep(interval)


def concurrency_verdict(k, tokens, samples, replies, seconds, generated, min_tok_s=0.0):
    """(ok, detail) of the concurrency proof.

    samples: (running, waiting) gauge pairs read from /metrics while the requests ran; replies: each request's
    parsed answer, or a string saying why there is none; seconds: each request's wall time (the last one is
    the whole batch's); generated: how much vllm:generation_tokens_total rose across the batch."""
    problems = []
    counts, per_stream, texts = [], [], set()
    for i, reply in enumerate(replies):
        if isinstance(reply, str):
            problems.append(f"request {i + 1}: {reply}")
            continue
        n = (reply.get("usage") or {}).get("completion_tokens")
        choice = reply["choices"][0]
        if n != tokens or choice.get("finish_reason") != "length":
            problems.append(f"request {i + 1}: {n} completion tokens (finish_reason {choice.get('finish_reason')}), "
                            f"want exactly {tokens} (length)")
        counts.append(n if isinstance(n, int) and not isinstance(n, bool) else 0)
        if seconds[i] > 0:
            per_stream.append(counts[-1] / seconds[i])
        texts.add(choice["message"].get("content") or "")
    if len(texts) > 1:
        problems.append(f"the {k} identical greedy requests answered {len(texts)} different texts")
    busy = [(r, w) for r, w in samples if r > 0 or w > 0]
    peak = max((r for r, _ in busy), default=0)
    queued = max((w for _, w in busy), default=0)
    if not busy:
        problems.append(f"no /metrics sample of {len(samples)} saw a request running (they ended first: raise "
                        "gate_concurrency_tokens)")
    elif peak != k:
        why = "other requests were running" if peak > k else "not all scheduled together (--max-num-seqs below K?)"
        problems.append(f"vllm:num_requests_running peaked at {peak:g}, want {k}: {why}")
    if queued > 0:
        problems.append(f"vllm:num_requests_waiting reached {queued:g} while they ran (requests queued, not scheduled)")
    total = sum(counts)
    if generated < total:
        problems.append(f"vllm:generation_tokens_total rose by {generated:g}, less than the {total} completion "
                        "tokens the replies count")
    wall = seconds[-1] if seconds else 0.0
    aggregate = total / wall if wall > 0 else 0.0
    if min_tok_s and aggregate < min_tok_s:
        problems.append(f"aggregate {aggregate:.2f} tok/s is below gate_min_aggregate_tok_s {min_tok_s:g}")
    rate = (f"{k} x {tokens} tokens in {wall:.2f} s: aggregate {aggregate:.2f} tok/s, per stream "
            f"{min(per_stream, default=0):.2f}-{max(per_stream, default=0):.2f} tok/s (usage.completion_tokens); "
            f"running peak {peak:g}, waiting peak {queued:g} over {len(samples)} samples")
    return not problems, "; ".join(problems + [rate])


def concurrency_proof(base, model, k, tokens, min_tok_s=0.0, poll=0.1):
    """K simultaneous bounded requests, /metrics sampled while they run (see concurrency_verdict)."""
    replies, seconds = [None] * k, [0.0] * k
    timeout = max(120, tokens)  # a slow decode of N tokens still finishes (>= 1 tok/s)

    def one(i):
        t = time.monotonic()
        try:
            replies[i] = chat(base, model, CONCURRENCY_MESSAGES, timeout=timeout, max_tokens=tokens, ignore_eos=True)
        except (urllib.error.URLError, OSError, ValueError) as e:
            replies[i] = f"{type(e).__name__}: {e}"
        seconds[i] = time.monotonic() - t

    before = metric_samples(base).get(METRICS[0], 0.0)
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(k)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    samples = []
    while any(t.is_alive() for t in threads):
        try:
            gauges = metric_samples(base)
            samples.append((gauges.get(METRICS[1], 0.0), gauges.get(WAITING, 0.0)))
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(poll)
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    generated = metric_samples(base).get(METRICS[0], 0.0) - before
    return concurrency_verdict(k, tokens, samples, replies, seconds + [wall], generated, min_tok_s)


def metric_samples(base):
    """{metric name: summed value over its label sets} from /metrics."""
    _, text = call(base, "/metrics")
    samples = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfINFNa]+)", line)
        if m:
            try:
                samples[m.group(1)] = samples.get(m.group(1), 0.0) + float(m.group(3))
            except ValueError:
                pass
    return samples


def run_checks(base, model, concurrency=0, concurrency_tokens=256, min_aggregate_tok_s=0.0):
    results = []

    def check(name, fn):
        try:
            ok, detail = fn()
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
            ok, detail = False, f"{type(e).__name__}: {e}"
        results.append({"check": name, "ok": bool(ok), "detail": detail})

    def health():
        status, _ = call(base, "/health", timeout=10)
        return status == 200, f"HTTP {status}"

    def models():
        _, raw = call(base, "/v1/models", timeout=10)
        ids = [m["id"] for m in json.loads(raw)["data"]]
        return model in ids, f"served: {ids}"

    counter = {}

    def coherence():
        counter["before"] = metric_samples(base).get(METRICS[0], 0.0)
        reply = chat(base, model, COHERENCE_MESSAGES)
        content = reply["choices"][0]["message"]["content"] or ""
        counter["completion_tokens"] = reply["usage"]["completion_tokens"]
        return "Paris" in content, f"answer: {content[:120]!r}"

    def usage():
        n = counter.get("completion_tokens")
        return isinstance(n, int) and not isinstance(n, bool) and n > 0, f"usage.completion_tokens = {n}"

    def metrics():
        samples = metric_samples(base)
        missing = [m for m in METRICS if m not in samples]
        if missing:
            return False, f"/metrics lacks {', '.join(missing)}"
        grew = samples[METRICS[0]] - counter.get("before", samples[METRICS[0]])
        need = max(1, counter.get("completion_tokens") or 1)
        return grew >= need, (f"{METRICS[0]} rose by {grew:g} (completion_tokens {need}); "
                              f"num_requests_running {samples[METRICS[1]]:g}, kv_cache_usage_perc {samples[METRICS[2]]:g}")

    def tool_round_trip():
        first = chat(base, model, TOOL_MESSAGES, tools=[WEATHER_TOOL], tool_choice=TOOL_CHOICE)["choices"][0]["message"]
        calls = first.get("tool_calls") or []
        if not calls or calls[0]["function"]["name"] != "get_weather":
            return False, f"no get_weather call: {str(first)[:160]}"
        raw_args = calls[0]["function"]["arguments"]
        try:
            args = json.loads(raw_args)
        except ValueError:
            return False, f"arguments do not parse: {raw_args[:120]!r}"
        if args != TOOL_ARGUMENTS:
            return False, f"arguments {args}, want {TOOL_ARGUMENTS}"
        messages = tool_result_messages(calls[0].get("id") or "call_0", "get_weather", raw_args)
        final = chat(base, model, messages, tools=[WEATHER_TOOL])["choices"][0]["message"]["content"] or ""
        return "18" in final and "sunny" in final, f"args {args}; continuation: {final[:120]!r}"

    def strict_json():
        choice = chat(base, model, JSON_MESSAGES, response_format=RESPONSE_FORMAT)["choices"][0]
        content = choice["message"]["content"] or ""
        try:
            value = json.loads(content)
        except ValueError:
            return False, f"not JSON (finish_reason {choice.get('finish_reason')}): {content[:120]!r}"
        errors = schema_errors(value, CITY_SCHEMA)
        if not errors and "paris" not in value["city"].lower():
            errors = [f"city {value['city']!r} is not Paris"]
        return not errors, "; ".join(errors + [content[:120]]) if errors else content[:120]

    checks = [("health", health), ("models", models), ("coherence", coherence), ("usage", usage),
              ("metrics", metrics), ("tool_round_trip", tool_round_trip), ("strict_json", strict_json)]
    if concurrency:
        checks.append(("concurrency", lambda: concurrency_proof(base, model, concurrency, concurrency_tokens,
                                                                min_aggregate_tok_s)))
    for name, fn in checks:
        check(name, fn)
    return results


def main(argv):
    parser = argparse.ArgumentParser(description="the serving gate (one JSON object per check on stdout)")
    parser.add_argument("base")
    parser.add_argument("model")
    parser.add_argument("--wait", type=float, default=0, help="first wait up to S seconds for /health")
    parser.add_argument("--ready-only", action="store_true", help="only the wait (a 'ready' check)")
    parser.add_argument("--concurrency", type=int, default=0, help="K simultaneous requests (0: no proof)")
    parser.add_argument("--concurrency-tokens", type=int, default=256, help="exact completion tokens of each")
    parser.add_argument("--min-aggregate-tok-s", type=float, default=0.0)
    parser.add_argument("--cacert", help="CA file an https BASE is verified with (an authenticated endpoint)")
    args = parser.parse_args(argv)
    if args.cacert:
        import ssl

        CLIENT["ssl"] = ssl.create_default_context(cafile=args.cacert)
    results = []
    if args.wait or args.ready_only:
        try:
            results.append({"check": "ready", "ok": True, "detail": f"/health 200 after {wait_ready(args.base, args.wait):.1f} s"})
        except TimeoutError as e:
            results.append({"check": "ready", "ok": False, "detail": str(e)})
    if not args.ready_only and all(r["ok"] for r in results):
        results += run_checks(args.base, args.model, args.concurrency, args.concurrency_tokens,
                              args.min_aggregate_tok_s)
    for r in results:
        print(json.dumps(r))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

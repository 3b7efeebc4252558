#!/usr/bin/env python3
"""The serving gate: is a running OpenAI-compatible server answering *correctly*, not just with HTTP 200?
Stdlib only; runs on the node (the API stays on loopback) or anywhere that can reach the URL.

    serving_gate.py BASE_URL MODEL_NAME      -> one JSON object per line: {"check", "ok", "detail"}

Checks: /health; /v1/models lists MODEL_NAME; coherence at temperature 0 ("capital of France" must say
Paris); a named tool call (get_weather, arguments exactly {"city": "Paris"}) and its tool-result
continuation (must mention 18 and sunny); a strict JSON-schema answer that parses, validates and names
Paris; token counts from usage.completion_tokens (never from stream chunks); vLLM's generation-token counter
rising across a request, and its running-requests and KV-cache gauges present. Exit status 0 only when
every check passed.

Every request is greedy and bounded (MAX_TOKENS, $SERVING_GATE_MAX_TOKENS overrides), and every structured
one has a closed, bounded schema (enum, maxLength, integer bounds, no extra keys): a broken model still
finishes each request quickly, with HTTP 200 and nonsense, and fails on content. The requests are plain
data here (COHERENCE_MESSAGES, TOOL_MESSAGES, tool_result_messages, JSON_MESSAGES, ...) so that the
sandbox's known-answer model (tests/sandbox/tiny_model.py) is trained on exactly what the gate sends.
"""

import json
import os
import re
import sys
import urllib.error
import urllib.request

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

TYPES = {"string": str, "number": (int, float), "integer": int, "object": dict, "array": list, "boolean": bool}
METRICS = ("vllm:generation_tokens_total", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")


def tool_result_messages(call_id, name, arguments):
    """The continuation after the tool call: the assistant's call as the server returned it (id, name,
    arguments string), then the tool's answer."""
    return TOOL_MESSAGES + [
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": TOOL_RESULT},
    ]


def call(base, path, body=None, timeout=120):
    req = urllib.request.Request(base.rstrip("/") + path, method="POST" if body is not None else "GET",
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read().decode("utf-8", "replace")
        return r.status, raw


def chat(base, model, messages, **extra):
    status, raw = call(base, "/v1/chat/completions", {"model": model, "messages": messages, "temperature": 0,
                                                       "max_tokens": MAX_TOKENS, **extra})
    return json.loads(raw)


def schema_errors(value, schema):
    """The subset of JSON Schema the gate's bounded schemas use: type, enum, maxLength/minLength,
    minimum/maximum, properties, required, additionalProperties: false."""
    errors = []
    kind = schema.get("type")
    want = TYPES.get(kind)
    if want and (not isinstance(value, want) or (kind in ("number", "integer") and isinstance(value, bool))):
        return [f"expected {kind}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{value!r} not in {schema['enum']}")
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"longer than {schema['maxLength']}")
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(f"shorter than {schema['minLength']}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{value} < minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{value} > maximum {schema['maximum']}")
    if kind == "object":
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"missing {key}")
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                errors += [f"{key}: {e}" for e in schema_errors(value[key], sub)]
        if schema.get("additionalProperties") is False:
            errors += [f"unexpected {k}" for k in value if k not in schema.get("properties", {})]
    return errors


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


def run_checks(base, model):
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

    for name, fn in (("health", health), ("models", models), ("coherence", coherence), ("usage", usage),
                     ("metrics", metrics), ("tool_round_trip", tool_round_trip), ("strict_json", strict_json)):
        check(name, fn)
    return results


def main(argv):
    base, model = argv
    results = run_checks(base, model)
    for r in results:
        print(json.dumps(r))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""The serving gate: is a running OpenAI-compatible server answering *correctly*, not just with HTTP 200?
Stdlib only; runs on the node (the API stays on loopback) or anywhere that can reach the URL.

    serving_gate.py BASE_URL MODEL_NAME      -> one JSON object per line: {"check", "ok", "detail"}

Checks: /health; /v1/models lists MODEL_NAME; coherence at temperature 0 ("capital of France" must say
Paris); a native tool call and its tool-result continuation; a strict JSON-schema answer that parses and
validates; token counts from usage.completion_tokens (never from stream chunks); vLLM's
generation-token counter rising across a request. Exit status 0 only when every check passed.
"""

import json
import re
import sys
import urllib.error
import urllib.request

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}, "population_millions": {"type": "number"}},
    "required": ["city", "country", "population_millions"],
    "additionalProperties": False,
}
TYPES = {"string": str, "number": (int, float), "integer": int, "object": dict, "array": list, "boolean": bool}


def call(base, path, body=None, timeout=120):
    req = urllib.request.Request(base.rstrip("/") + path, method="POST" if body is not None else "GET",
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read().decode("utf-8", "replace")
        return r.status, raw


def chat(base, model, messages, **extra):
    status, raw = call(base, "/v1/chat/completions", {"model": model, "messages": messages, "temperature": 0,
                                                       "max_tokens": 256, **extra})
    return json.loads(raw)


def schema_errors(value, schema):
    """The subset of JSON Schema strict structured outputs use: type, properties, required, no extras."""
    errors = []
    want = TYPES.get(schema.get("type"))
    if want and (not isinstance(value, want) or (schema.get("type") == "number" and isinstance(value, bool))):
        return [f"expected {schema['type']}, got {type(value).__name__}"]
    if schema.get("type") == "object":
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"missing {key}")
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                errors += [f"{key}: {e}" for e in schema_errors(value[key], sub)]
        if schema.get("additionalProperties") is False:
            errors += [f"unexpected {k}" for k in value if k not in schema.get("properties", {})]
    return errors


def generation_tokens(base):
    _, text = call(base, "/metrics")
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^vllm:generation_tokens_total(\{[^}]*\})?\s+([0-9.eE+]+)", line)
        if m:
            total += float(m.group(2))
    return total


def run_checks(base, model):
    results = []

    def check(name, fn):
        try:
            ok, detail = fn()
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as e:
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
        counter["before"] = generation_tokens(base)
        reply = chat(base, model, [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}])
        content = reply["choices"][0]["message"]["content"] or ""
        counter["completion_tokens"] = reply["usage"]["completion_tokens"]
        return "Paris" in content, f"answer: {content[:120]!r}"

    def usage():
        n = counter.get("completion_tokens")
        return isinstance(n, int) and n > 0, f"usage.completion_tokens = {n}"

    def metrics():
        after = generation_tokens(base)
        grew = after - counter.get("before", after)
        return grew >= max(1, counter.get("completion_tokens") or 1), f"vllm:generation_tokens_total rose by {grew:g}"

    def tool_round_trip():
        messages = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
        first = chat(base, model, messages, tools=[WEATHER_TOOL], tool_choice="auto")["choices"][0]["message"]
        calls = first.get("tool_calls") or []
        if not calls or calls[0]["function"]["name"] != "get_weather":
            return False, f"no get_weather call: {str(first)[:160]}"
        args = json.loads(calls[0]["function"]["arguments"])
        messages += [first, {"role": "tool", "tool_call_id": calls[0]["id"], "content": "18 C and sunny"}]
        final = chat(base, model, messages, tools=[WEATHER_TOOL])["choices"][0]["message"]["content"] or ""
        return "18" in final and "sunny" in final, f"args {args}; continuation: {final[:120]!r}"

    def strict_json():
        fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True}}
        reply = chat(base, model, [{"role": "user", "content": "Describe Paris as JSON."}], response_format=fmt)
        content = reply["choices"][0]["message"]["content"] or ""
        errors = schema_errors(json.loads(content), CITY_SCHEMA)
        return not errors, "; ".join(errors) or content[:120]

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

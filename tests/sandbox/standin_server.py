#!/usr/bin/env python3
"""A stand-in for the inference server inside the sandbox's service image (stdlib only): an
OpenAI-compatible /health, /v1/models, /v1/chat/completions (tool calls and JSON-schema answers included)
and a Prometheus /metrics with vLLM's generation counter and its running-requests and KV-cache gauges (v1
names). STANDIN_MODE=garbage makes it answer 200 with nonsense (the serving gate must fail it). Listens on
INFERENCE_API_HOST:INFERENCE_API_PORT (set by the unit from inventory data); like vLLM, the served name is
SERVED_MODEL_NAME or else the model path.
"""

import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NAME = os.environ.get("SERVED_MODEL_NAME") or os.environ.get("MODEL_PATH", "stand-in")
GARBAGE = os.environ.get("STANDIN_MODE") == "garbage"
generated = 0
lock = threading.Lock()


def answer(body):
    """(message, completion token count) for a chat request."""
    messages = body.get("messages", [])
    if GARBAGE:
        return {"role": "assistant", "content": "\u00ff ## ## lorem \ufffd\ufffd 7 7 7"}, 9
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return {"role": "assistant", "content": f"The weather tool says: {last.get('content')}."}, 8
    if body.get("tools") and last.get("role") == "user":
        choice = body.get("tool_choice")
        name = choice["function"]["name"] if isinstance(choice, dict) else body["tools"][0]["function"]["name"]
        return {"role": "assistant", "content": "", "tool_calls": [{
            "id": "call_standin_1", "type": "function",
            "function": {"name": name, "arguments": json.dumps({"city": "Paris"})}}]}, 12
    fmt = body.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        return {"role": "assistant", "content": json.dumps(
            {"city": "Paris", "country": "France", "population_millions": 2})}, 20
    text = " ".join(str(m.get("content", "")) for m in messages)
    if "capital of France" in text:
        return {"role": "assistant", "content": "The capital of France is Paris."}, 7
    return {"role": "assistant", "content": "I am a stand-in model."}, 6


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, status, body, ctype="application/json"):
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self._send(200, "")
        if self.path == "/v1/models":
            return self._send(200, json.dumps({"object": "list", "data": [{"id": NAME, "object": "model"}]}))
        if self.path == "/metrics":
            labels = f'{{model_name="{NAME}",engine="0"}}'
            return self._send(200, f"vllm:generation_tokens_total{labels} {generated}.0\n"
                                   f"vllm:num_requests_running{labels} 0.0\nvllm:kv_cache_usage_perc{labels} 0.0\n",
                              "text/plain")
        return self._send(404, json.dumps({"error": "not found"}))

    def do_POST(self):
        global generated
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path != "/v1/chat/completions":
            return self._send(404, json.dumps({"error": "not found"}))
        message, tokens = answer(body)
        with lock:
            generated += tokens
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        return self._send(200, json.dumps({
            "id": "chatcmpl-standin", "object": "chat.completion", "model": NAME,
            "choices": [{"index": 0, "finish_reason": finish, "message": message}],
            "usage": {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": 8 + tokens},
        }))


def main():
    host = os.environ.get("INFERENCE_API_HOST", "127.0.0.1")
    port = int(os.environ.get("INFERENCE_API_PORT", "8000"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # PID 1 in the container: stop promptly
    server = ThreadingHTTPServer((host, port), H)
    print(f"stand-in inference server for {NAME} on {host}:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())

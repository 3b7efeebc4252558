"""A client of a sandbox head through a switch, on the LAN through its authenticated endpoint or on the node through
its door on the clients' loopback port (the node tier's drills and bench/serve.py's): what it saw, counted."""

from __future__ import annotations

import json
import time

STREAM_TOKENS = 200  # in flight when the door closes in most runs (the drain waits for it); done well within endpoint_drain_s


class EndpointClient:
    """A client of a head through a switch: one chat a second, and one stream started before the switch. Counts
    what it saw: good answers, wrong answers (HTTP 200 without the known answer), JSON 503s with Retry-After (the
    closed door) and anything else. ``door``: on the head's clients' port (plain, no key; the sandbox's nodes share
    this machine's loopback), else through its TLS endpoint with the sandbox's client keys."""

    def __init__(self, node: str, inventory: str = "inventories/sandbox.py", door: bool = False):
        import threading

        import requests

        from deploys.endpoint import endpoint_url, url_host
        from deploys.schema.control_readers import read_clients
        from deploys.inventory import inventory_configs, load_inventory
        from deploys.service.unit import served_model_name

        cfg = inventory_configs(load_inventory(inventory))[node]
        self.model = served_model_name(cfg)
        self.requests = requests
        if door:
            self.url, self.ca = f"http://{url_host(cfg.api_bind_address)}:{cfg.api_port}/v1/chat/completions", None
            self.headers = self.stream_headers = {}
        else:
            self.url, self.ca = endpoint_url(cfg) + "/v1/chat/completions", cfg.endpoint_tls_ca
            keys = read_clients(cfg.endpoint_clients_file)
            # two clients: one may have only one request in flight (endpoint_key_concurrency below --max-num-seqs 2)
            self.headers = {"Authorization": f"Bearer {keys['demo']}"}
            self.stream_headers = {"Authorization": f"Bearer {keys['demo-stream']}"}
        self.seen: dict[str, int] = {"good": 0, "wrong": 0, "closed": 0, "other": 0}
        self.closed_s, self.other, self.stream_tokens = 0.0, [], None
        self.retry_after: list[int] = []  # what each closed-door answer said, in order
        self.first_closed = self.stream_ended = None
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._poll, daemon=True),
                        threading.Thread(target=self._stream, daemon=True)]

    def _chat(self, max_tokens: int, stream: bool = False) -> dict:
        return {"model": self.model, "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": max_tokens, "temperature": 0, "stream": stream,
                **({"ignore_eos": True, "stream_options": {"include_usage": True}} if stream else {})}

    def _poll(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                r = self.requests.post(self.url, json=self._chat(16), headers=self.headers, verify=self.ca, timeout=120)
                self.first_closed = self.first_closed or (time.monotonic() if r.status_code == 503 else None)
                if r.status_code == 200:
                    content = r.json()["choices"][0]["message"]["content"] or ""
                    self.seen["good" if "Paris" in content else "wrong"] += 1
                elif (r.status_code == 503 and r.headers.get("Retry-After")
                      and r.json()["error"]["type"] == "service_unavailable"):
                    self.seen["closed"] += 1
                    self.retry_after.append(int(r.headers["Retry-After"]))
                    self.closed_s += max(1.0, time.monotonic() - t0)
                else:
                    self.seen["other"] += 1
                    self.other.append(f"{r.status_code} {r.text[:120]}")
            except (self.requests.RequestException, ValueError, KeyError) as e:
                self.seen["other"] += 1
                self.other.append(repr(e)[:160])
            self.stop.wait(max(0.0, 1.0 - (time.monotonic() - t0)))

    def _stream(self) -> None:
        with self.requests.post(self.url, json=self._chat(STREAM_TOKENS, stream=True), headers=self.stream_headers,
                                verify=self.ca, timeout=600, stream=True) as r:
            lines = [line for line in r.iter_lines(decode_unicode=True) if line]
        self.stream_ended = time.monotonic()
        usage = [json.loads(line[5:]) for line in lines if line.startswith("data: {") and '"completion_tokens"' in line]
        self.stream_tokens = usage[-1]["usage"]["completion_tokens"] if usage else None

    def __enter__(self):
        self.threads[0].start()
        time.sleep(2)
        self.threads[1].start()  # a stream in flight when the converge starts
        time.sleep(1)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=600)

    @property
    def stream_in_flight_at_close(self) -> bool:
        """Whether the stream started before the switch was still running when the door closed."""
        return bool(self.first_closed and self.stream_ended and self.stream_ended > self.first_closed)

    def summary(self) -> str:
        return (f"{self.seen['good']} good answers, {self.seen['wrong']} wrong, {self.seen['closed']} JSON 503s "
                f"({self.closed_s:.0f} s closed), {self.seen['other']} other; a stream of {self.stream_tokens} "
                f"tokens ({'in flight when the door closed' if self.stream_in_flight_at_close else 'done before'}); "
                f"Retry-After {self.told()}")

    def told(self) -> str:
        """What the closed door told, each change once: `60 -> 45 -> 30 (x12)`."""
        runs: list[list[int]] = []
        for seconds in self.retry_after:
            if runs and runs[-1][0] == seconds:
                runs[-1][1] += 1
            else:
                runs.append([seconds, 1])
        return " -> ".join(f"{s} s" + (f" (x{n})" if n > 1 else "") for s, n in runs) or "none"

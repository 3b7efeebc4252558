"""The sandbox's alert receiver: a small HTTP listener on loopback that takes Alertmanager's webhook posts (the URL
of the sandbox inventory's `alertmanager_webhook_url_file`), for the node tests (``WebhookListener``) and for a
person watching the demo (`python -m tests.sandbox.webhook_listener`: prints each notification as it comes).

Alertmanager's webhook body: {"status": "firing"|"resolved", "alerts": [{"status", "labels", "annotations", ...}]}.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = 9199  # inventories/sandbox.py's webhook URL


class WebhookListener:
    """Collects every alert Alertmanager posts while it runs (a context manager; loopback only)."""

    def __init__(self, port: int = PORT):
        self.alerts: list[dict] = []
        self._lock = threading.Condition()
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    alerts = json.loads(body).get("alerts", [])
                except ValueError:
                    alerts = []
                with listener._lock:
                    listener.alerts += [{**a, "received": time.time()} for a in alerts]
                    listener._lock.notify_all()
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> WebhookListener:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def wait_for(self, alertname: str, host: str, status: str, timeout: float, since: float = 0.0) -> dict:
        """The first alert ``alertname`` on ``host`` with ``status`` received after ``since``; TimeoutError saying
        what did arrive."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                for alert in self.alerts:
                    labels = alert.get("labels", {})
                    if (labels.get("alertname"), labels.get("host"), alert.get("status")) == (alertname, host, status) \
                            and alert["received"] >= since:
                        return alert
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = sorted({(a["labels"].get("alertname"), a["labels"].get("host"), a.get("status"))
                                   for a in self.alerts})
                    raise TimeoutError(f"no {status} {alertname} for {host} within {timeout:.0f} s (received: {seen})")
                self._lock.wait(min(left, 1.0))


def main() -> int:
    with WebhookListener() as listener:
        print(f"listening on 127.0.0.1:{PORT} for Alertmanager's notifications (Ctrl-C stops)", flush=True)
        seen = 0
        try:
            while True:
                time.sleep(1)
                for alert in listener.alerts[seen:]:
                    labels = alert.get("labels", {})
                    print(f"{alert.get('status'):8} {labels.get('alertname')} on {labels.get('host')}: "
                          f"{alert.get('annotations', {}).get('summary', '')}", flush=True)
                seen = len(listener.alerts)
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    sys.exit(main())

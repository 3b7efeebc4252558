"""The sandbox's alert receiver: a small HTTP listener on loopback that takes Alertmanager's webhook posts (the URL
of the sandbox inventory's `alertmanager_webhook_url_file`, path /alerts) and stands for the outside dead man's
switch (`alertmanager_watchdog_url_file`, path /watchdog), for the node tests (``WebhookListener``) and for a person
watching the demo (`python -m tests.sandbox.webhook_listener`: prints each notification as it comes).

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
        self.refused: set[str] = set()  # paths answered with 500 (a receiver whose token expired)
        self._lock = threading.Condition()
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    alerts = json.loads(body).get("alerts", [])
                except ValueError:
                    alerts = []
                refused = self.path in listener.refused
                with listener._lock:
                    if not refused:
                        listener.alerts += [{**a, "received": time.time(), "path": self.path} for a in alerts]
                    listener._lock.notify_all()
                self.send_response(500 if refused else 200)
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

    def received(self, alertname: str, path: str, since: float = 0.0) -> list[dict]:
        """The notifications of ``alertname`` taken on ``path`` after ``since``."""
        with self._lock:
            return [a for a in self.alerts if a.get("labels", {}).get("alertname") == alertname
                    and a["path"] == path and a["received"] >= since]

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
                    labels, at = alert.get("labels", {}), time.strftime("%H:%M:%S", time.localtime(alert["received"]))
                    if alert["path"] == "/watchdog":
                        print(f"{at} dead man's switch: pinged by {labels.get('alertname')}", flush=True)
                        continue
                    print(f"{at} {alert.get('status'):8} {labels.get('alertname')} on {labels.get('host')}: "
                          f"{alert.get('annotations', {}).get('summary', '')}", flush=True)
                seen = len(listener.alerts)
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    sys.exit(main())

"""A loopback HTTP server for the unit tier: every GET is answered with what the test decides at that moment (the
stand-ins of vLLM's and Prometheus's /metrics)."""

from __future__ import annotations

import http.server
import threading
from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def serving(answer: Callable[[], str | None]) -> Iterator[int]:
    """Serve ``answer()`` for each GET on 127.0.0.1 (the body, HTTP 200; None: HTTP 500); yields the port."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            text = answer()
            if text is None:
                self.send_response(500)
                self.end_headers()
                return
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()

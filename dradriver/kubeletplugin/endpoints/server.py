"""HTTP for operators: /healthz (the process serves), /readyz (registered with the
kubelet, the API server reachable, slices published) and /metrics."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from dradriver.httpreply import reply

if TYPE_CHECKING:
    from dradriver.kubeletplugin.endpoints.metrics import Metrics

Check = Callable[[], tuple[bool, str]]


class OpsServer:
    def __init__(
        self,
        address: str,
        port: int,
        metrics: Metrics | None,
        *,
        live: dict[str, Check],
        ready: dict[str, Check],
    ) -> None:
        """`metrics` may be set later: the server answers probes from before the first
        slice is published, and prometheus_client (a twentieth of a second to import)
        is imported after it."""
        outer = self
        self.metrics, self.live, self.ready = metrics, live, ready

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/metrics":
                    if outer.metrics is None:
                        reply(self, 503, b"starting: no metrics yet\n", ctype="text/plain")
                        return
                    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

                    body = generate_latest(outer.metrics.registry)
                    reply(self, 200, body, ctype=CONTENT_TYPE_LATEST)
                elif self.path in ("/healthz", "/readyz"):
                    extra = outer.ready if self.path == "/readyz" else {}
                    results = {name: check() for name, check in {**outer.live, **extra}.items()}
                    ok = all(r[0] for r in results.values())
                    doc = {name: {"ok": r[0], "detail": r[1]} for name, r in results.items()}
                    body = json.dumps(doc, indent=1).encode() + b"\n"
                    reply(self, 200 if ok else 503, body, ctype="application/json")
                else:
                    reply(self, 404, b"not found\n", ctype="text/plain")

            def log_message(self, format: str, *args: object) -> None:
                pass  # probes every few seconds would drown the real logs

        self.httpd = ThreadingHTTPServer((address, port), Handler)
        self.port = self.httpd.server_address[1]

    def start(self) -> None:
        threading.Thread(target=self.httpd.serve_forever, name="endpoints", daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

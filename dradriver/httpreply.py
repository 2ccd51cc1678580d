"""The one way our small HTTP servers (plugin ops, admission webhook) answer a request."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler


def reply(handler: BaseHTTPRequestHandler, code: int, body: bytes, *, ctype: str) -> None:
    handler.send_response(code)
    handler.send_header("Content-Type", ctype)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)

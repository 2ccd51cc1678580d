"""A listening Unix socket, bound before the server that will accept on it is even
imported: the kubelet's plugin watcher sees the registration socket appear and connects
at once; the connection waits in the backlog (accepted by the kernel) until the server
accepts it, a few tens of milliseconds later."""

from __future__ import annotations

import socket
from pathlib import Path


def bind_unix(path: Path, backlog: int = 128) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.bind(str(path))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock

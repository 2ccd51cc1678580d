"""A stand-in for nvidia-imex in fake mode: a real process with the daemon's observable
behaviour as NVIDIA's IMEX guide (docs.nvidia.com/multi-node-nvlink-systems/imex-guide)
describes it, so that tests can prove a node's daemon is started with its peers, that
the peers reach each other, and that it stops.

- Configuration (config.html): `KEY=VALUE` lines read once at start ("If you change the
  config file options ... restart the IMEX service"). Used here: BIND_INTERFACE_IP,
  SERVER_PORT (default 50000), IMEX_NODE_CONFIG_FILE (one node address a line),
  IMEX_CMD_ENABLED, IMEX_CMD_PORT (the command service nvidia-imex-ctl talks to, here on
  BIND_INTERFACE_IP), DAEMONIZE (must be 0: the plugin owns the process).
- Readiness (connections.html): "IMEX no longer requires a full quorum to complete
  initialization ... ready for processing immediately after starting"; it reconnects
  to peers that go and come back.
- Signals (signals.html): SIGTERM, SIGINT and SIGQUIT shut it down (it tells its peers).

Each daemon listens on BIND_INTERFACE_IP:SERVER_PORT and keeps a connection to every
other node of its nodes file, trying again every RETRY seconds; on one machine, nodes
are distinct loopback addresses (127.0.0.0/8 is all local on Linux) with the same port,
as real nodes share one SERVER_PORT.

Faults for tests, in the config (never in NVIDIA's): FAKE_NEVER_READY=1 (the command
service answers UNAVAILABLE for ever).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

RETRY = 0.2
DEFAULT_SERVER_PORT = 50000
DEFAULT_CMD_PORT = 50005


def read_config(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip()
    return out


def read_nodes(path: Path) -> list[str]:
    return [
        ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")
    ]


class Daemon:
    def __init__(self, config: dict[str, str]) -> None:
        if config.get("DAEMONIZE", "1") != "0":
            raise SystemExit("fake nvidia-imex: run with DAEMONIZE=0 (the plugin owns the process)")
        self.ip = config.get("BIND_INTERFACE_IP", "")
        self.port = int(config.get("SERVER_PORT", DEFAULT_SERVER_PORT))
        self.cmd_port = int(config.get("IMEX_CMD_PORT", DEFAULT_CMD_PORT))
        self.cmd = config.get("IMEX_CMD_ENABLED", "0") == "1"
        self.nodes = read_nodes(
            Path(config.get("IMEX_NODE_CONFIG_FILE", "/etc/nvidia-imex/nodes_config.cfg"))
        )
        if self.ip not in self.nodes:
            raise SystemExit(
                f"fake nvidia-imex: BIND_INTERFACE_IP {self.ip!r} is not in the nodes config"
            )
        self.never_ready = config.get("FAKE_NEVER_READY") == "1"
        self.connected: dict[str, bool] = {n: n == self.ip for n in self.nodes}
        # How often our connection to each peer was made: 1 while the domain has stayed
        # up since this daemon started (a restarted peer is connected to again).
        self.connects: dict[str, int] = dict.fromkeys(self.nodes, 0)
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def serve(self) -> None:
        server = socket.create_server((self.ip, self.port), reuse_port=False)
        threading.Thread(target=self._accept, args=(server, self._hold), daemon=True).start()
        if self.cmd:
            cmd = socket.create_server((self.ip, self.cmd_port))
            threading.Thread(target=self._accept, args=(cmd, self._answer), daemon=True).start()
        for peer in self.nodes:
            if peer != self.ip:
                threading.Thread(target=self._keep, args=(peer,), daemon=True).start()

    def _accept(self, server: socket.socket, handle: Callable[[socket.socket], None]) -> None:
        """Each connection to `server` handled in a thread of its own, until stopped."""
        server.settimeout(RETRY)
        while not self.stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        """A peer's connection: held open until either side goes."""
        with conn:
            self._until_closed(conn)

    def _until_closed(self, conn: socket.socket) -> None:
        conn.settimeout(RETRY)
        while not self.stop.is_set():
            try:
                if not conn.recv(64):
                    return
            except TimeoutError:
                continue
            except OSError:
                return

    def _keep(self, peer: str) -> None:
        """Our connection to `peer`, made again whenever it breaks."""
        while not self.stop.is_set():
            try:
                conn = socket.create_connection((peer, self.port), timeout=RETRY)
            except OSError:
                self.stop.wait(RETRY)
                continue
            with conn:
                try:
                    conn.sendall(f"HELLO {self.ip}\n".encode())
                except OSError:  # the peer went between its accept and our hello
                    self.stop.wait(RETRY)
                    continue
                self._set(peer, True)
                self._until_closed(conn)
            self._set(peer, False)

    def _set(self, peer: str, up: bool) -> None:
        with self.lock:
            self.connected[peer] = up
            self.connects[peer] += up

    def status(self) -> dict[str, object]:
        with self.lock:
            nodes = [
                {"address": n, "connected": self.connected[n], "connects": self.connects[n]}
                for n in self.nodes
            ]
        return {"status": "UNAVAILABLE" if self.never_ready else "READY", "nodes": nodes}

    def _answer(self, conn: socket.socket) -> None:
        """One command-service request: the status, as JSON on one line."""
        with conn:
            conn.settimeout(2)
            try:
                conn.recv(16)
                conn.sendall((json.dumps(self.status()) + "\n").encode())
            except OSError:
                pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fake-nvidia-imex")
    p.add_argument("-c", dest="config", required=True, help="config.cfg")
    args = p.parse_args(argv)
    daemon = Daemon(read_config(Path(args.config)))

    def quit_(signum: int, frame: object) -> None:
        daemon.stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, quit_)
    daemon.serve()
    print(f"fake nvidia-imex: pid={os.getpid()} listening on {daemon.ip}:{daemon.port}", flush=True)
    while not daemon.stop.wait(0.5):
        pass
    print("fake nvidia-imex: shutting down", flush=True)
    time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The fake nvidia-imex and nvidia-imex-ctl: three nodes on distinct loopback addresses
and one port reach each other, a peer that dies is seen gone and found again when it
comes back, and a daemon told never to get ready says so."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

NODES = ["127.0.0.11", "127.0.0.12", "127.0.0.13"]


def free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


class Node:
    def __init__(self, tmp: Path, ip: str, port: int, cmd_port: int, extra: str = "") -> None:
        self.ip, self.dir = ip, tmp / ip
        self.dir.mkdir(exist_ok=True)
        (self.dir / "nodes_config.cfg").write_text("\n".join(NODES) + "\n")
        self.config = self.dir / "config.cfg"
        self.config.write_text(
            "DAEMONIZE=0\n"
            f"BIND_INTERFACE_IP={ip}\nSERVER_PORT={port}\n"
            f"IMEX_NODE_CONFIG_FILE={self.dir / 'nodes_config.cfg'}\n"
            f"IMEX_CMD_ENABLED=1\nIMEX_CMD_PORT={cmd_port}\n{extra}"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fakenvml.imexd", "-c", str(self.config)]
        )

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=10)

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fakenvml.imexctl", "-c", str(self.config), *args],
            capture_output=True,
            text=True,
            timeout=10,
        )

    def connected(self) -> dict[str, bool]:
        out = self.ctl("-N", "-j")
        if out.returncode:
            return {}
        return {n["address"]: n["connected"] for n in json.loads(out.stdout)["nodes"]}


def until(fn: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fn():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out: {fn}")


@pytest.fixture
def rack(tmp_path: Path) -> Iterator[list[Node]]:
    port, cmd = free_port(NODES[0]), free_port(NODES[0])
    nodes = [Node(tmp_path, ip, port, cmd) for ip in NODES]
    yield nodes
    for n in nodes:
        if n.proc is not None and n.proc.poll() is None:
            n.proc.kill()
            n.proc.wait()


def test_three_nodes_reach_each_other_and_a_dead_peer_is_found_again(rack: list[Node]) -> None:
    a, b, c = rack
    for n in rack:
        n.start()
    until(lambda: all(all(n.connected().values()) and n.connected() for n in rack))
    assert a.ctl("-q").stdout.strip() == "READY" and a.ctl("-q").returncode == 0
    assert c.stop() == 0
    until(lambda: a.connected().get(c.ip) is False and b.connected().get(c.ip) is False)
    assert a.connected()[b.ip] is True
    c.start()
    until(lambda: a.connected().get(c.ip) is True and c.connected() == dict.fromkeys(NODES, True))


def test_a_daemon_that_never_gets_ready_says_so(tmp_path: Path) -> None:
    ip = NODES[0]
    n = Node(tmp_path, ip, free_port(ip), free_port(ip), "FAKE_NEVER_READY=1\n")
    n.start()
    try:
        until(lambda: n.ctl("-q").stdout.strip() == "UNAVAILABLE")
        assert n.ctl("-q").returncode == 1
    finally:
        n.stop()


def test_no_daemon_no_answer_and_refusals(tmp_path: Path) -> None:
    ip = NODES[0]
    n = Node(tmp_path, ip, free_port(ip), free_port(ip))
    out = n.ctl("-q")
    assert out.returncode == 1 and "cannot reach the IMEX command service" in out.stderr
    bad = tmp_path / "bad.cfg"
    bad.write_text(n.config.read_text().replace("DAEMONIZE=0", "DAEMONIZE=1"))
    proc = subprocess.run(
        [sys.executable, "-m", "fakenvml.imexd", "-c", str(bad)], capture_output=True, text=True
    )
    assert proc.returncode != 0 and "DAEMONIZE=0" in proc.stderr

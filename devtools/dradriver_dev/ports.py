"""Loopback ports for the components a test or the demo starts.

A port is chosen now and bound later, sometimes a minute later (the scheduler waits for
the API server). Asking the kernel for port 0 hands out a port from the ephemeral range,
the same range every outgoing connection takes its source port from, and a test suite
opens thousands of those: one took the controller-manager's port between choice and bind
(CI, "bind: address already in use"). So ports come from below the ephemeral range, at
random so that parallel test workers rarely meet, and are bound once to see they are free.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10000  # below this live well-known and registered services


def _ephemeral_low() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_ports(n: int) -> list[int]:
    """`n` distinct loopback ports, free now and outside the ephemeral range."""
    high = _ephemeral_low()
    if high - _LOWEST < 1000:
        high = 65535  # a host that gave most ports to the ephemeral range
    socks: list[socket.socket] = []
    try:
        while len(socks) < n:
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", random.randrange(_LOWEST, high)))
            except OSError:
                s.close()
                continue
            socks.append(s)  # held until all are chosen so no two picks are the same
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]

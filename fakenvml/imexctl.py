"""A stand-in for nvidia-imex-ctl in fake mode: `-c <config.cfg>` to find the daemon's
command service (IMEX_CMD_PORT on BIND_INTERFACE_IP), then `-q` prints the local node's
state (READY or UNAVAILABLE; exit 0 when READY) and `-N -j` the whole domain as JSON
(every node of the nodes config, and whether this daemon is connected to it), as the
IMEX guide's command service page lists the options. Exit 1 when the command service
does not answer (no daemon, or not started yet)."""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path

from fakenvml.imexd import DEFAULT_CMD_PORT, read_config


def query(config: Path, timeout: float = 2.0) -> dict[str, object]:
    cfg = read_config(config)
    addr = (
        cfg.get("BIND_INTERFACE_IP", "127.0.0.1"),
        int(cfg.get("IMEX_CMD_PORT", DEFAULT_CMD_PORT)),
    )
    with socket.create_connection(addr, timeout=timeout) as conn:
        conn.sendall(b"status\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
    out: dict[str, object] = json.loads(data)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fake-nvidia-imex-ctl")
    p.add_argument("-c", dest="config", default="/etc/nvidia-imex/config.cfg")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("-q", action="store_true", help="the local node's state")
    what.add_argument("-N", action="store_true", help="the whole domain's status")
    p.add_argument("-j", action="store_true", help="JSON (with -N)")
    args = p.parse_args(argv)
    try:
        status = query(Path(args.config))
    except (OSError, ValueError) as exc:
        print(f"cannot reach the IMEX command service: {exc}", file=sys.stderr)
        return 1
    if args.q:
        print(status["status"])
        return 0 if status["status"] == "READY" else 1
    print(json.dumps(status) if args.j else status)
    return 0


if __name__ == "__main__":
    sys.exit(main())

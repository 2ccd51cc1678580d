"""A stand-in for nvidia-cuda-mps-control in fake mode: a real process with the daemon's
observable lifecycle (pipe and log directories, a control file while it runs, a
heartbeat its clients see, a clean exit on SIGTERM), so tests can prove a daemon is
started, survives the plugin, and stops."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from fakenvml import mps_v3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fake-mps-control")
    p.add_argument("--pipe-dir", required=True)
    p.add_argument("--log-dir", required=True)
    p.add_argument("--devices", required=True)
    # The directory the real daemon would see as /dev/shm (shared with its clients).
    p.add_argument("--shm-dir")
    # -p 3: MPS v3, with servers and namespaces (fakenvml.mps_v3).
    p.add_argument("--protocol", type=int, default=2, choices=[2, 3])
    args = p.parse_args(argv)
    pipe, logs = Path(args.pipe_dir), Path(args.log_dir)
    control = pipe / "control"
    log = logs / "control.log"
    running = True

    def quit_(signum: int, frame: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, quit_)
    mps_v3.started(pipe, args.protocol, args.devices)
    if args.shm_dir:
        # What the real server keeps there for its clients: proof they share one.
        Path(args.shm_dir, "cuda.shm.mps-server").write_text(f"{os.getpid()}\n")
    with open(log, "a") as f:
        f.write(f"started pid={os.getpid()} devices={args.devices} protocol={args.protocol}\n")
    # Last, as the real daemon's control pipe: once it is there, the daemon serves.
    control.write_text(f"{os.getpid()}\n")
    beats = 0
    while running:
        # What its clients can see of it (they share the pipe directory): a counter that
        # goes on while the daemon serves, and stops the moment it dies.
        beats += 1
        (pipe / "heartbeat").write_text(str(beats))
        time.sleep(0.1)
    control.unlink(missing_ok=True)
    with open(log, "a") as f:
        f.write("quit\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

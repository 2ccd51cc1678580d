"""Fault injection from outside the process that owns a fake node: `dradriver dev inject`.

The process running the fake GPUs (the kubelet plugin with `--devices fake:...`) watches
<state dir>/fake-nvml-<node>.requests/. A request is one small JSON file, written
atomically (a temporary name, then a rename); the owner applies it to its machine as
the hardware would have done it (the XID event, the GPU off the bus, a reset), writes
<id>.done with the outcome and removes the request. The running plugin therefore sees
the fault as it would see the real one: through NVML, with no restart.

Only the owner touches the machine: two processes never write the fake state at once.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fakenvml.machine import FakeMachine

FORMAT = 1
POLL_SECONDS = 0.1
ACTIONS = ("xid", "lost", "recover", "driver")


class InjectError(RuntimeError):
    pass


@dataclass(frozen=True)
class Request:
    gpu: int
    action: str  # "xid", "lost" or "recover"
    xid: int | None = None
    gpu_instance: int | None = None  # XIDs NVML ties to a GPU instance
    driver_version: str | None = None  # action "driver": the version NVML reports from now

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "gpu": self.gpu,
            "action": self.action,
            "xid": self.xid,
            "gpuInstance": self.gpu_instance,
            "driverVersion": self.driver_version,
        }

    @classmethod
    def from_json(cls, doc: Any) -> Request:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise InjectError(f"unknown request format (this fake reads format {FORMAT})")
        action = doc.get("action")
        if action not in ACTIONS:
            raise InjectError(f"unknown action {action!r}; one of {', '.join(ACTIONS)}")
        gpu, xid, gi = doc.get("gpu"), doc.get("xid"), doc.get("gpuInstance")
        version = doc.get("driverVersion")
        if action == "driver":
            if not isinstance(version, str) or not version:
                raise InjectError("action driver needs a driverVersion")
            return cls(0, action, driver_version=version)
        if not isinstance(gpu, int) or (action == "xid" and not isinstance(xid, int)):
            raise InjectError("a request needs an integer gpu (and xid for action xid)")
        return cls(gpu, action, xid, gi if isinstance(gi, int) else None)


def requests_dir(state_dir: Path, node: str) -> Path:
    return state_dir / f"fake-nvml-{node}.requests"


def nodes_in(state_dir: Path) -> list[str]:
    """The fake nodes whose state lies in `state_dir`."""
    return sorted(
        p.name.removeprefix("fake-nvml-").removesuffix(".json")
        for p in state_dir.glob("fake-nvml-*.json")
    )


def apply(machine: FakeMachine, req: Request) -> str:
    """Applies one request; what happened, in words."""
    if req.action == "driver":
        assert req.driver_version is not None
        old = machine.upgrade_driver(req.driver_version)
        return f"driver {old} replaced by {req.driver_version} (NVML reports it from now)"
    if not 0 <= req.gpu < len(machine.gpus):
        raise InjectError(f"no GPU {req.gpu}: this node has GPUs 0..{len(machine.gpus) - 1}")
    uuid = machine.gpus[req.gpu].uuid
    if req.action == "xid":
        assert req.xid is not None
        machine.faults.xid_error(req.gpu, req.xid, gpu_instance_id=req.gpu_instance)
        scope = f" (GPU instance {req.gpu_instance})" if req.gpu_instance is not None else ""
        return f"XID {req.xid} raised on GPU {req.gpu} ({uuid}){scope}"
    if req.action == "lost":
        machine.faults.lose_gpu(req.gpu)
        return f"GPU {req.gpu} ({uuid}) fell off the bus (XID 79)"
    machine.reset_gpu(req.gpu)
    return f"GPU {req.gpu} ({uuid}) reset: back on the bus, pending remappings done"


class Watcher:
    """The owner's side: a daemon thread that applies requests as they come. It ends
    with its machine (held weakly, so a fake node dropped by a test is not kept)."""

    def __init__(self, machine: FakeMachine, directory: Path) -> None:
        self._machine = weakref.ref(machine)
        self.directory = directory
        self._thread = threading.Thread(target=self._run, name="fake-inject", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(POLL_SECONDS)
            machine = self._machine()
            if machine is None:
                return
            self.poll(machine)
            del machine

    def poll(self, machine: FakeMachine) -> int:
        try:
            names = sorted(e.name for e in os.scandir(self.directory) if e.name.endswith(".json"))
        except FileNotFoundError:
            return 0
        for name in names:
            path = self.directory / name
            try:
                req = Request.from_json(json.loads(path.read_text()))
                outcome: dict[str, Any] = {"ok": True, "detail": apply(machine, req)}
            except FileNotFoundError:
                continue
            except (InjectError, ValueError) as exc:
                outcome = {"ok": False, "error": str(exc)}
            _write_atomic(path.with_suffix(".done"), outcome)
            path.unlink(missing_ok=True)
        return len(names)


def _write_atomic(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def send(state_dir: Path, node: str, req: Request, timeout: float = 5.0) -> str:
    """The outside's side: hands `req` to the process that owns the fake node and waits
    for its answer. Raises InjectError with what went wrong."""
    directory = requests_dir(state_dir, node)
    directory.mkdir(parents=True, exist_ok=True)
    rid = f"{time.time_ns()}-{secrets.token_hex(3)}"
    path = directory / f"{rid}.json"
    _write_atomic(path, req.to_json())
    done = path.with_suffix(".done")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done.exists():
            outcome = json.loads(done.read_text())
            done.unlink(missing_ok=True)
            if not outcome.get("ok"):
                raise InjectError(str(outcome.get("error")))
            return str(outcome.get("detail"))
        time.sleep(0.05)
    path.unlink(missing_ok=True)
    raise InjectError(
        f"no running process with fake GPUs of node {node} picked the request up within "
        f"{timeout:.0f} s: is the kubelet plugin running with --devices fake:... "
        f"--state-dir {state_dir}?"
    )

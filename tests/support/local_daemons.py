"""The daemons of a unit test's node as processes of this machine, as a kubelet would run
their pods (kubeletplugin/daemons/pods.py is the real edge, tested end to end): each
started under its pod's name with a UID of its own, restarted in place when it has
exited (restartPolicy Always keeps a pod's UID), found again by a second preparer over the
same directory (a restart), and stopped by SIGTERM to its process group."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dradriver.errors import DaemonError
from dradriver.kubeletplugin.daemons.spec import (
    COMPONENT,
    LABELS,
    DaemonRef,
    DaemonSpec,
    Role,
    component,
)


class LocalDaemons:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / "local-daemons.json"

    @contextlib.contextmanager
    def _table(self) -> Iterator[dict[str, Any]]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "local-daemons.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            table: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {}
            yield table
            self.path.write_text(json.dumps(table, sort_keys=True))

    def start(self, spec: DaemonSpec) -> DaemonRef:
        with self._table() as table:
            entry = table.get(spec.name)
            if entry is None:
                entry = {
                    "uid": str(uuid.uuid4()),
                    "labels": {**LABELS, COMPONENT: component(spec.role), **dict(spec.serves)},
                    "argv": list(spec.command.argv),
                    "env": dict(spec.command.env),
                }
                table[spec.name] = entry
            if not _alive(entry):
                entry.update(_spawn(entry))
            return DaemonRef(spec.name, entry["uid"])

    def wait(self, ref: DaemonRef, ready: Callable[[], bool], *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if not self.serving(ref):
                raise DaemonError(f"daemon {ref.name} exited at start", reason="daemon_exited")
            if time.monotonic() > deadline:
                raise DaemonError(f"daemon {ref.name} not ready", reason="daemon_not_ready")
            time.sleep(0.02)

    def serving(self, ref: DaemonRef) -> bool:
        with self._table() as table:
            entry = table.get(ref.name)
            return bool(entry) and (not ref.uid or entry["uid"] == ref.uid) and _alive(entry)

    def stop(self, ref: DaemonRef, *, timeout: float = 60.0) -> None:
        with self._table() as table:
            entry = table.get(ref.name)
            if entry is None or (ref.uid and entry["uid"] != ref.uid):
                return
            del table[ref.name]
        if _alive(entry):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(entry["pid"], signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while _alive(entry) and time.monotonic() < deadline:
                time.sleep(0.02)
            if _alive(entry):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(entry["pid"], signal.SIGKILL)

    def find(self, role: Role, **serves: str) -> list[tuple[DaemonRef, dict[str, str]]]:
        want = {COMPONENT: component(role), **serves}
        with self._table() as table:
            return [
                (DaemonRef(name, e["uid"]), dict(e["labels"]))
                for name, e in sorted(table.items())
                if all(e["labels"].get(k) == v for k, v in want.items())
            ]

    def stop_all(self) -> None:
        """Every daemon stopped (a test's teardown: none left behind, even on a failure)."""
        for name in self.names():
            self.stop(DaemonRef(name))

    def names(self) -> list[str]:
        """The daemons running now, by name."""
        with self._table() as table:
            return sorted(n for n, e in table.items() if _alive(e))

    def pid(self, name: str) -> int:
        with self._table() as table:
            return int(table[name]["pid"])

    def kill(self, name: str) -> None:
        """The daemon dies (SIGKILL), as an OOM kill or a crash ends one."""
        with self._table() as table:
            entry = table[name]
        os.killpg(entry["pid"], signal.SIGKILL)
        while _alive(entry):
            time.sleep(0.01)


def process_alive(pid: int) -> bool:
    """A process is there and not a zombie (one of ours is reaped first)."""
    if pid <= 0:
        return False
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    return _start_time(pid) is not None


def _spawn(entry: dict[str, Any]) -> dict[str, int]:
    proc = subprocess.Popen(
        entry["argv"],
        env={"PATH": os.environ.get("PATH", ""), **entry["env"]},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return {"pid": proc.pid, "start": _start_time(proc.pid) or 0}


def _start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return None if fields[0] == "Z" else int(fields[19])


def _alive(entry: dict[str, Any]) -> bool:
    pid = entry.get("pid")
    if not pid:
        return False
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
    return _start_time(pid) == entry.get("start")

"""The fake MPS daemon's control commands and limits, modelled on NVIDIA's MPS documentation
(docs.nvidia.com/deploy/mps, "MPS v3 Interface", "MPS v3 Namespaces", "Appendix:
Environment Variables", driver r615+), so tests can show a share held to its limits:

- `server create <name> [--allowed-devices=UUID,..]`, `namespace create <ns>
  --server=<s>`, `namespace set <ns> --server=<s> [--pinned-memory-limit=<N>G|M|K]
  [--active-thread-percentage=<1-100>]`, `namespace delete <ns> --server=<s>`: only on a
  daemon started with protocol 3 (`-p 3`); a protocol-2 daemon refuses them.
- A client picks its namespace by its pipe directory: `<pipe>/<server>/<ns>` (the
  directory holds that namespace's `control` socket; here a file).
- Limits: a named namespace does not inherit the server's; one without limits gets the
  whole GPU. The pinned-memory limit holds for each client process; a client's
  CUDA_MPS_PINNED_DEVICE_MEM_LIMIT can only lower it (a higher value is ignored), and
  under v3 the namespace's active-thread percentage overrides the client's variable.
  Without a namespace (a protocol-2 daemon) only the client's own variables limit it.
- Allocating past the limit fails with CUDA_ERROR_OUT_OF_MEMORY (2), as cudaMalloc does;
  the other clients are untouched.
- A client placed in a cgroup (its container's, under its pod's) with the GPU's dmem
  region is also charged there (fakenvml.dmem): past any ancestor's dmem.max, the
  allocation fails the same way, whichever of the pod's processes makes it. NVIDIA's
  MPS v3 memory partitioning accounts memory "across cgroups and containers"; that the
  client's cgroup, not the MPS server's, is charged is what the fake assumes from it.

The state lives in `<pipe>/fake-mps.json` beside the daemon's control file, so it
outlives the plugin as the real daemon does.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATE = "fake-mps.json"
CUDA_ERROR_OUT_OF_MEMORY = 2
_NAME = re.compile(r"^[a-z0-9_]{1,64}$")
_SIZE = re.compile(r"^(\d+)([GMK])$")
UNITS = {"G": 2**30, "M": 2**20, "K": 2**10}


class MpsCommandError(ValueError):
    pass


class CudaError(RuntimeError):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@contextlib.contextmanager
def _state(pipe: Path) -> Iterator[dict[str, Any]]:
    with open(pipe / (STATE + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = pipe / STATE
        doc: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        doc.setdefault("protocol", 2)
        doc.setdefault("servers", {})
        yield doc
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, sort_keys=True))
        os.replace(tmp, path)


def started(pipe: Path, protocol: int, devices: str) -> None:
    """The daemon came up: a fresh state (a restarted daemon knows no servers)."""
    with _state(pipe) as doc:
        doc.clear()
        doc.update(protocol=protocol, devices=devices, servers={})


def _options(words: list[str]) -> dict[str, str]:
    out = {}
    for w in words:
        key, eq, value = w.partition("=")
        if not key.startswith("--") or not eq:
            raise MpsCommandError(f"unexpected argument {w!r}")
        out[key[2:]] = value
    return out


def _size(text: str) -> int:
    m = _SIZE.match(text)
    if not m:
        raise MpsCommandError(f"bad memory limit {text!r} (e.g. 4G, 512M)")
    return int(m[1]) * UNITS[m[2]]


def command(pipe: Path, line: str) -> str:
    """One line given to `nvidia-cuda-mps-control`; its answer, or MpsCommandError."""
    words = line.split()
    if not (pipe / "control").exists():
        raise MpsCommandError("cannot find MPS control daemon process")
    with _state(pipe) as doc:
        if words[:1] in (["server"], ["namespace"]) and doc["protocol"] != 3:
            raise MpsCommandError(f"{words[0]} commands need protocol 3 (-p 3)")
        servers: dict[str, Any] = doc["servers"]
        match words:
            case ["server", "create", name, *rest]:
                if not _NAME.match(name) or name in servers:
                    raise MpsCommandError(f"cannot create server {name!r}")
                opts = _options(rest)
                servers[name] = {"devices": opts.get("allowed-devices", ""), "namespaces": {}}
                (pipe / name).mkdir(exist_ok=True)
                (pipe / name / "control").write_text("server\n")
            case ["namespace", "create", ns, *rest]:
                server = servers.get(_options(rest).get("server", ""))
                if server is None or not _NAME.match(ns) or ns in server["namespaces"]:
                    raise MpsCommandError(f"cannot create namespace {ns!r}")
                server["namespaces"][ns] = {}
                srv = _options(rest)["server"]
                (pipe / srv / ns).mkdir(exist_ok=True)
                (pipe / srv / ns / "control").write_text("namespace\n")
            case ["namespace", "set", ns, *rest]:
                opts = _options(rest)
                server = servers.get(opts.pop("server", ""))
                if server is None or ns not in server["namespaces"]:
                    raise MpsCommandError(f"no namespace {ns!r}")
                limits = server["namespaces"][ns]
                for key, value in opts.items():
                    if key == "pinned-memory-limit":
                        limits["pinned"] = _size(value)
                    elif key == "active-thread-percentage":
                        if not value.isdigit() or not 1 <= int(value) <= 100:
                            raise MpsCommandError(f"bad percentage {value!r}")
                        limits["threads"] = int(value)
                    else:
                        raise MpsCommandError(f"unknown option --{key}")
            case ["namespace", "delete", ns, *rest]:
                srv = _options(rest).get("server", "")
                server = servers.get(srv)
                if server is None or server["namespaces"].pop(ns, None) is None:
                    raise MpsCommandError(f"no namespace {ns!r}")
                with contextlib.suppress(OSError):
                    (pipe / srv / ns / "control").unlink()
                    (pipe / srv / ns).rmdir()
            case _:
                raise MpsCommandError(f"unknown command {line!r}")
    return ""


def namespaces(pipe: Path) -> dict[str, dict[str, Any]]:
    """server/namespace -> its limits ({"pinned": bytes, "threads": percent})."""
    path = pipe / STATE
    if not path.exists():
        return {}
    doc = json.loads(path.read_text())
    return {
        f"{s}/{n}": dict(limits)
        for s, srv in doc.get("servers", {}).items()
        for n, limits in srv["namespaces"].items()
    }


@dataclass
class Client:
    """A CUDA process connecting through `pipe_dir` with environment `env`, as a container
    of a share would: its limits are the namespace's (MPS v3) or its own variables'."""

    pipe_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    used: int = 0
    cgroup: Path | None = None  # the process's cgroup, with `region` the GPU's dmem region
    region: str = ""

    def limits(self) -> tuple[int | None, int | None]:
        """(pinned bytes, active thread percent) this client gets; None: no limit."""
        if not (self.pipe_dir / "control").exists():
            raise CudaError(999, f"no MPS control daemon in {self.pipe_dir}")
        pinned: int | None = None
        threads: int | None = None
        root, rel = self.pipe_dir, ""
        while not (root / STATE).exists() and root.parent != root:
            rel = f"{root.name}/{rel}" if rel else root.name
            root = root.parent
        ns = namespaces(root).get(rel) if rel else None
        if ns is not None:
            pinned, threads = ns.get("pinned"), ns.get("threads")
        own = self.env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "")
        for entry in filter(None, own.split(",")):
            _, _, value = entry.partition("=")
            try:
                limit = _size(value.strip())
            except MpsCommandError:
                continue
            pinned = limit if pinned is None else min(pinned, limit)  # only ever lower
        if ns is None or "threads" not in ns:
            pct = self.env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "")
            if pct.isdigit():
                threads = int(pct) if threads is None else min(threads, int(pct))
        return pinned, threads

    def allocate(self, n_bytes: int) -> None:
        pinned, _ = self.limits()
        if pinned is not None and self.used + n_bytes > pinned:
            raise CudaError(
                CUDA_ERROR_OUT_OF_MEMORY,
                f"out of memory: {self.used + n_bytes} bytes past the limit of {pinned}",
            )
        if self.cgroup is not None:
            from fakenvml import dmem

            try:
                dmem.charge(self.cgroup, self.region, n_bytes)
            except dmem.DmemLimitExceeded as exc:
                raise CudaError(CUDA_ERROR_OUT_OF_MEMORY, f"out of memory: {exc}") from exc
        self.used += n_bytes

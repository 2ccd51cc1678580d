"""The kernel's dmem cgroup controller (Linux 6.14+, "kernel/cgroup: Add dmem memory
accounting cgroup"), as far as the fake GPU-memory limits need it, on a directory tree
standing for a cgroup v2 mount (tests make one; the fake never touches /sys/fs/cgroup):

- The hierarchy root's `dmem.capacity` lists the registered regions, one `<name> <bytes>`
  line each; NVIDIA's driver registers `nvidia/<pci>/vidmem` per GPU (NVIDIA's guide
  "Per-GPU Compute and Memory Limits with MPS": `cat /sys/fs/cgroup/dmem.capacity lists
  one nvidia/<pci>/vidmem line per GPU`). The PCI address is written as the kernel names
  devices (4-digit domain, lowercase): an assumption, NVIDIA shows no example.
- Each cgroup's `dmem.max`, `dmem.min` and `dmem.current` hold `<region> <value>` lines; a
  region not listed is at its default (max: `max`, min and current: 0).
- NVIDIA's memory partitioning maps its hard limit to dmem.max (an allocation past it
  fails with out-of-memory) and its soft limit to dmem.min.
- A charge counts in the cgroup and every ancestor, and fails if any of them would pass
  its dmem.max (the controller's page_counter semantics), so a pod's limit bounds all
  of its containers' processes together.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

CAPACITY = "dmem.capacity"
HOST_CGROUPS = Path("/sys/fs/cgroup")


class DmemLimitExceeded(RuntimeError):
    pass


def region(legacy_bus_id: str) -> str:
    return f"nvidia/{legacy_bus_id.lower()}/vidmem"


def make_hierarchy(root: Path, regions: dict[str, int]) -> None:
    """A cgroup v2 mount with the dmem controller and the GPUs' regions registered."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids dmem\n")
    (root / CAPACITY).write_text("".join(f"{r} {n}\n" for r, n in sorted(regions.items())))


def make_cgroup(path: Path) -> None:
    """A child cgroup (as the kubelet's mkdir would make it), dmem enabled."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.controllers").write_text("cpuset cpu io memory pids dmem\n")


def hierarchy_root(cgroup: Path) -> Path | None:
    for p in [cgroup, *cgroup.parents]:
        if (p / CAPACITY).exists():
            return p
    return None


def capacity(root: Path) -> dict[str, int]:
    return {k: int(v) for k, v in _read(root / CAPACITY).items()}


def _read(path: Path) -> dict[str, str]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name:
            out[name] = value.strip()
    return out


def _write(path: Path, name: str, value: str) -> None:
    values = _read(path)
    values[name] = value
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(f"{k} {v}\n" for k, v in sorted(values.items())))
    tmp.replace(path)


def set_limits(cgroup: Path, name: str, low: int, high: int | None) -> None:
    _write(cgroup / "dmem.max", name, "max" if high is None else str(high))
    _write(cgroup / "dmem.min", name, str(low))


def limits(cgroup: Path, name: str) -> tuple[int, int | None, int]:
    """(dmem.min, dmem.max or None for `max`, dmem.current) of `cgroup` for `name`."""
    high = _read(cgroup / "dmem.max").get(name, "max")
    return (
        int(_read(cgroup / "dmem.min").get(name, "0")),
        None if high == "max" else int(high),
        int(_read(cgroup / "dmem.current").get(name, "0")),
    )


def _chain(cgroup: Path) -> list[Path]:
    root = hierarchy_root(cgroup)
    if root is None:
        raise FileNotFoundError(f"{cgroup} is in no cgroup hierarchy with {CAPACITY}")
    chain = [cgroup]
    while chain[-1] != root:
        chain.append(chain[-1].parent)
    return chain


@contextlib.contextmanager
def _locked(cgroup: Path) -> Iterator[list[Path]]:
    chain = _chain(cgroup)
    with open(chain[-1] / ".fake-dmem.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield chain


def charge(cgroup: Path, name: str, n_bytes: int) -> None:
    """An allocation of `n_bytes` on region `name` by a process in `cgroup`."""
    with _locked(cgroup) as chain:
        for cg in chain:
            _, high, current = limits(cg, name)
            if high is not None and current + n_bytes > high:
                raise DmemLimitExceeded(
                    f"dmem: {cg} would hold {current + n_bytes} bytes of {name}, past its "
                    f"dmem.max of {high}"
                )
        for cg in chain:
            _write(cg / "dmem.current", name, str(limits(cg, name)[2] + n_bytes))


def uncharge(cgroup: Path, name: str, n_bytes: int) -> None:
    with _locked(cgroup) as chain:
        for cg in chain:
            _write(cg / "dmem.current", name, str(max(0, limits(cg, name)[2] - n_bytes)))

"""The fake backend's GpuHost (see dradriver.nvml.host): what a real node would run
outside NVML is recorded or played by stand-ins, so every path of the driver runs on a
machine without GPUs.

- time-slice intervals: recorded in <state dir>/fake-sharing-<node>.json, as nvidia-smi
  would have set them;
- the MPS control daemon: a real stand-in process (fakenvml.mpsd) with the daemon's
  lifecycle, run as the real one is (kubeletplugin/daemons/: a pod of its own);
- device nodes: none (they do not exist here); the CDI spec then names the GPUs by
  environment only; an IMEX channel is named with the fake's own major number (the
  kernel assigns the real one: /proc/devices);
- the IMEX daemon and its ctl: real stand-in processes (fakenvml.imexd, imexctl), with
  a never-ready fault from <state dir>/fake-imex-faults.json ({"neverReady": true});
- stand-ins run in the plugin's image (or, on a dev node, its interpreter), never in the
  driver root: no chroot, no device node, nothing privileged;
- PCIe roots: one per pair of buses, as the switches of an HGX board group them.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

from dradriver.nvml.host import (
    IMEX_CHANNELS_DIR,
    TIMESLICE,
    DaemonCommand,
    DeviceNode,
    imex_query,
    mps_env,
)

# The fake's nvidia-caps-imex-channels major (a real one is the kernel's choice).
FAKE_IMEX_MAJOR = 509


class FakeHost:
    def __init__(self, record: Path) -> None:
        self.record = record
        # Prepares on different GPUs set intervals at once (threads, or two plugin
        # instances on one node): the record's read-change-write is one at a time.
        self._mutex = threading.Lock()

    def pcie_root(self, bus_id: str) -> str | None:
        try:
            bus = int(bus_id.split(":")[1], 16)
        except (IndexError, ValueError):
            return None
        return f"pci0000:{bus & 0xC0:02x}"

    def set_timeslice(self, uuid: str, interval: str) -> None:
        self.record.parent.mkdir(parents=True, exist_ok=True)
        lock = self.record.with_name(self.record.name + ".lock")
        with self._mutex, open(lock, "a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            rec = self.recorded()
            rec.setdefault(uuid, {})["timeslice"] = TIMESLICE[interval]
            fd, tmp = tempfile.mkstemp(dir=self.record.parent, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(rec, sort_keys=True))
            os.replace(tmp, self.record)

    def recorded(self) -> dict[str, dict[str, int]]:
        """What nvidia-smi would have been asked to set, by GPU UUID."""
        if not self.record.exists():
            return {}
        data: dict[str, dict[str, int]] = json.loads(self.record.read_text())
        return data

    def mps_daemon(
        self, uuids: list[str], pipe_dir: Path, log_dir: Path, *, shm_dir: Path, protocol: int = 2
    ) -> DaemonCommand:
        argv = [sys.executable, "-m", "fakenvml.mpsd", "--pipe-dir", str(pipe_dir)]
        argv += ["--log-dir", str(log_dir), "--devices", ",".join(uuids)]
        argv += ["--shm-dir", str(shm_dir), "--protocol", str(protocol)]
        return DaemonCommand(tuple(argv), mps_env(uuids, pipe_dir, log_dir))

    def make_tmpfs(self, path: Path, *, size: int, mode: int) -> bool:
        # No tmpfs without privileges: the directory, with the mode the real one is
        # mounted with (set explicitly: mkdir's mode is cut by the umask), and the size
        # recorded beside it (<name>-size) for the tests.
        fresh = not path.exists()
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(mode)
        (path.parent / f"{path.name}-size").write_text(str(size))
        return fresh

    def drop_tmpfs(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)
        (path.parent / f"{path.name}-size").unlink(missing_ok=True)

    def mps_command(self, pipe_dir: Path, command: str) -> str:
        from dradriver.errors import SharingError
        from fakenvml import mps_v3

        try:
            return mps_v3.command(pipe_dir, command)
        except (mps_v3.MpsCommandError, OSError) as exc:
            raise SharingError(f"MPS control `{command}`: {exc}", reason="mps") from exc

    def device_nodes(
        self, gpu_minor: int | None, mig_ids: tuple[int, int] | None
    ) -> list[DeviceNode]:
        return []

    def control_device_nodes(self) -> list[DeviceNode]:
        return []

    def imex_channel_node(self, channel: int) -> DeviceNode:
        return DeviceNode(f"{IMEX_CHANNELS_DIR}/channel{channel}", "c", FAKE_IMEX_MAJOR, channel)

    def imex_daemon(self, config: Path) -> DaemonCommand:
        faults = self.record.with_name("fake-imex-faults.json")
        try:
            never = bool(json.loads(faults.read_text()).get("neverReady"))
        except (OSError, ValueError, AttributeError):
            never = False
        if never and "FAKE_NEVER_READY=1" not in config.read_text():
            with open(config, "a") as f:
                f.write("FAKE_NEVER_READY=1\n")
        return DaemonCommand((sys.executable, "-m", "fakenvml.imexd", "-c", str(config)))

    def imex_ready(self, config: Path) -> tuple[bool, str]:
        return imex_query([sys.executable, "-m", "fakenvml.imexctl", "-c", str(config), "-q"])

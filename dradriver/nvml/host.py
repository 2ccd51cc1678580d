"""What a node does to its GPUs outside the NVML library: the commands and device files
that exist only where the NVIDIA driver is installed.

`GpuHost` is the one seam between real and fake GPUs beyond NVML itself. `RealHost`
(here) runs nvidia-smi and nvidia-cuda-mps-control, says how the driver's daemons are
run and names the /dev nodes a container needs; the fake backend (package fakenvml,
chosen only by `--devices fake:...` in dradriver.nvml.library) records what it would
have run, names stand-in daemons and no device nodes. Nothing else in the driver asks
which one it has.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Protocol

from dradriver.errors import SharingError
from dradriver.logs import get_logger
from dradriver.nvml.discover import sysfs_pcie_root
from dradriver.nvml.mig import caps_access, caps_major, device_major

log = get_logger("nvml.host")

# nvidia-smi compute-policy --set-timeslice values.
TIMESLICE = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
# Every CUDA process opens these besides its GPUs' own nodes.
CONTROL_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


@dataclass(frozen=True)
class DeviceNode:
    """A /dev node a container needs. With type, major and minor the runtime makes the
    node from them instead of copying the host's (which a containerised driver may not
    have under /dev)."""

    path: str
    type: str | None = None  # "c"
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None


@dataclass(frozen=True)
class DaemonCommand:
    """A daemon a prepared claim depends on, as its node runs it: the command and its
    environment, and whether it runs in the host's driver root (chroot: the driver's own
    binaries and libraries, as NVIDIA runs them) with the GPUs' device nodes
    (privileged). kubeletplugin/daemons/ turns it into a pod of its own."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    in_driver_root: bool = False
    privileged: bool = False
    # Run before the daemon is sent SIGTERM (MPS: `quit`, as NVIDIA's documentation stops it).
    pre_stop: tuple[str, ...] = ()


def mps_env(uuids: list[str], pipe_dir: Path, log_dir: Path) -> tuple[tuple[str, str], ...]:
    """What an MPS control daemon reads: its GPUs, its pipe and log directories."""
    return (
        ("CUDA_VISIBLE_DEVICES", ",".join(uuids)),
        ("CUDA_MPS_PIPE_DIRECTORY", str(pipe_dir)),
        ("CUDA_MPS_LOG_DIRECTORY", str(log_dir)),
    )


class GpuHost(Protocol):
    def pcie_root(self, bus_id: str) -> str | None:
        """The PCIe root complex of a GPU ("pci0000:00"), or None if unknown."""

    def set_timeslice(self, uuid: str, interval: str) -> None:
        """Sets a GPU's time-slice interval ("Default", "Short", "Medium", "Long")."""

    def mps_daemon(
        self, uuids: list[str], pipe_dir: Path, log_dir: Path, *, shm_dir: Path, protocol: int = 2
    ) -> DaemonCommand:
        """The MPS control daemon for these GPUs (kubeletplugin/daemons/ runs it in a pod
        of its own), with `shm_dir` as its /dev/shm, shared with its clients. Protocol 3:
        MPS v3 (driver r615+), with named servers and namespaces."""

    def make_tmpfs(self, path: Path, *, size: int, mode: int) -> bool:
        """Makes `path` a tmpfs of at most `size` bytes with `mode` (an MPS daemon's pipe,
        log and /dev/shm directories, which its clients' containers get too: memory, never
        the disk that holds the plugin's state). Idempotent: True when it was made now.
        SharingError when it cannot be mounted."""

    def drop_tmpfs(self, path: Path) -> None:
        """Unmounts and removes what make_tmpfs made (idempotent)."""

    def mps_command(self, pipe_dir: Path, command: str) -> str:
        """Gives the daemon of `pipe_dir` one control command; its answer. SharingError
        when it refuses."""

    def device_nodes(
        self, gpu_minor: int | None, mig_ids: tuple[int, int] | None
    ) -> list[DeviceNode]:
        """The /dev nodes a container needs for one GPU, or one MIG device of it (GPU
        instance and compute instance ids); [] where no such nodes exist."""

    def control_device_nodes(self) -> list[DeviceNode]:
        """The /dev nodes every GPU container needs (nvidiactl, uvm)."""

    def imex_channel_node(self, channel: int) -> DeviceNode:
        """/dev/nvidia-caps-imex-channels/channel<N>: what a container of a ComputeDomain
        gets to import and export memory over NVLink within its IMEX domain."""

    def imex_daemon(self, config: Path) -> DaemonCommand:
        """The IMEX daemon of `config` (`nvidia-imex -c config`, DAEMONIZE=0 in it)."""

    def imex_ready(self, config: Path) -> tuple[bool, str]:
        """Whether the daemon of `config` answers READY (`nvidia-imex-ctl -c config -q`),
        and what it said."""


# The IMEX package's commands (NVIDIA IMEX guide: "Getting Started with IMEX").
# Found on PATH: the chart appends the driver root's usr/bin to the image's.
IMEX_DAEMON = "nvidia-imex"
IMEX_CTL = "nvidia-imex-ctl"
IMEX_CHANNELS_DIR = "/dev/nvidia-caps-imex-channels"


def _run(cmd: list[str], *, reason: str, failed: Callable[[str], str] | None = None) -> None:
    """Runs a node command that must succeed; a SharingError with what it said (`failed`
    words it, else the command line leads) when it does not."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SharingError(f"{' '.join(cmd)}: {exc}", reason=reason) from exc
    if out.returncode != 0:
        said = out.stderr.strip() or out.stdout.strip()
        raise SharingError(failed(said) if failed else f"{' '.join(cmd)}: {said}", reason=reason)


class RealHost:
    """A node with the NVIDIA driver: nvidia-smi, nvidia-cuda-mps-control, nvidia-imex,
    /dev, /proc."""

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.proc_root = proc_root

    def pcie_root(self, bus_id: str) -> str | None:
        return sysfs_pcie_root(bus_id)

    def set_timeslice(self, uuid: str, interval: str) -> None:
        cmd = ["nvidia-smi", "compute-policy", "-i", uuid, "--set-timeslice"]
        cmd.append(str(TIMESLICE[interval]))
        _run(cmd, reason="timeslice")

    def mps_daemon(
        self, uuids: list[str], pipe_dir: Path, log_dir: Path, *, shm_dir: Path, protocol: int = 2
    ) -> DaemonCommand:
        # `-f` keeps the daemon in the foreground, as a container's process must stay;
        # the man page lists it from driver R510 on. Its server is found beside it in the
        # driver root, hence the chroot; `quit` before SIGTERM lets it end its servers.
        argv = ("nvidia-cuda-mps-control", "-f", *(("-p", "3") if protocol == 3 else ()))
        return DaemonCommand(
            argv,
            mps_env(uuids, pipe_dir, log_dir),
            in_driver_root=True,
            privileged=True,
            pre_stop=("sh", "-c", "echo quit | nvidia-cuda-mps-control"),
        )

    def make_tmpfs(self, path: Path, *, size: int, mode: int) -> bool:
        # A tmpfs, not a directory of the state volume: what a pod writes there is then
        # memory charged to the pod, within the size, instead of the disk that holds the
        # checkpoint. The plugin mounts it in its own mount namespace; the chart mounts
        # the state directory with Bidirectional propagation so that the runtime, which
        # bind-mounts it into the claim's containers and the daemon's pod, sees it.
        path.mkdir(parents=True, exist_ok=True)
        if os.path.ismount(path):
            return False
        options = f"size={size},mode={mode:o},nosuid,nodev,noexec"
        cmd = ["mount", "-t", "tmpfs", "-o", options, "dradriver-mps", str(path)]
        _run(
            cmd,
            reason="mps",
            failed=lambda said: (
                f"mounting a tmpfs for the MPS daemon at {path}: {said}; the plugin needs "
                "CAP_SYS_ADMIN (the chart's nvml mode runs it privileged)"
            ),
        )
        return True

    def drop_tmpfs(self, path: Path) -> None:
        if os.path.ismount(path):
            out = subprocess.run(["umount", str(path)], capture_output=True, text=True)
            if out.returncode != 0:
                # Still open somewhere (a client's process not yet gone): detached now,
                # freed by the kernel when the last user closes it.
                subprocess.run(["umount", "-l", str(path)], capture_output=True)
        shutil.rmtree(path, ignore_errors=True)

    def mps_command(self, pipe_dir: Path, command: str) -> str:
        env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir)}
        try:
            done = subprocess.run(
                ["nvidia-cuda-mps-control"],
                input=command + "\n",
                text=True,
                env=env,
                capture_output=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SharingError(f"MPS control `{command}`: {exc}", reason="mps") from exc
        answer = (done.stdout + done.stderr).strip()
        if done.returncode != 0 or answer.lower().startswith("error"):
            raise SharingError(
                f"MPS control `{command}` failed ({done.returncode}): {answer[:300]}",
                reason="mps",
            )
        return answer

    def device_nodes(
        self, gpu_minor: int | None, mig_ids: tuple[int, int] | None
    ) -> list[DeviceNode]:
        if not isinstance(gpu_minor, int) or isinstance(gpu_minor, bool) or gpu_minor < 0:
            raise ValueError(
                "CDI: the GPU has no minor number, so its /dev/nvidia<minor> node cannot be named"
            )
        nodes = [DeviceNode(f"/dev/nvidia{gpu_minor}")]
        if mig_ids is not None:
            # A MIG device needs the capability nodes of its GPU and compute instance:
            # numbers from /proc (nvidia-caps major, DeviceFileMinor, DeviceFileMode).
            major = caps_major(self.proc_root)
            gi_id, ci_id = mig_ids
            for minor, mode in caps_access(self.proc_root, gpu_minor, gi_id, ci_id=ci_id):
                path = f"/dev/nvidia-caps/nvidia-cap{minor}"
                if major is None:
                    nodes.append(DeviceNode(path))
                else:
                    nodes.append(DeviceNode(path, "c", major, minor, mode))
        return nodes

    def control_device_nodes(self) -> list[DeviceNode]:
        return [DeviceNode(p) for p in CONTROL_DEVICE_NODES]

    def imex_channel_node(self, channel: int) -> DeviceNode:
        path = f"{IMEX_CHANNELS_DIR}/channel{channel}"
        major = device_major(self.proc_root, "nvidia-caps-imex-channels")
        return DeviceNode(path) if major is None else DeviceNode(path, "c", major, channel)

    def imex_daemon(self, config: Path) -> DaemonCommand:
        return DaemonCommand((IMEX_DAEMON, "-c", str(config)), in_driver_root=True, privileged=True)

    def imex_ready(self, config: Path) -> tuple[bool, str]:
        return imex_query([IMEX_CTL, "-c", str(config), "-q"])


def imex_query(cmd: list[str]) -> tuple[bool, str]:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{' '.join(cmd)}: {exc}"
    said = (out.stdout.strip() or out.stderr.strip())[:300]
    return out.stdout.strip() == "READY", said


def get_compute_mode(nvml: ModuleType, uuid: str) -> int:
    try:
        return int(nvml.nvmlDeviceGetComputeMode(nvml.nvmlDeviceGetHandleByUUID(uuid)))
    except nvml.NVMLError as err:
        raise SharingError(
            f"reading the compute mode of {uuid}: {err}", reason="compute_mode"
        ) from err


def set_compute_mode(nvml: ModuleType, uuid: str, mode: int) -> None:
    try:
        nvml.nvmlDeviceSetComputeMode(nvml.nvmlDeviceGetHandleByUUID(uuid), mode)
    except nvml.NVMLError as err:
        raise SharingError(
            f"setting the compute mode of {uuid}: {err}", reason="compute_mode"
        ) from err


def exclusive_process(nvml: ModuleType) -> int:
    return int(nvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)

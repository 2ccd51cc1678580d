"""`dradriver doctor`, the pure part: each layer of a GPU node judged from facts the
command gathered, bottom-up, as a line that is ok or names the fault and its fix.

Here a layer's verdict, the node's host layers that come first (NVML, the driver's files,
CDI) and a dev cluster's summary; the plugin's /readyz is judged in doctor_plugin.py,
what the API server says of the node in doctor_cluster.py."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any


class State(Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "FAIL"
    SKIP = "skip"


@dataclass(frozen=True)
class Layer:
    name: str
    state: State
    text: str
    fix: str = ""

    def line(self) -> str:
        text = self.text.rstrip(" .") + ("." if self.fix else "")
        fix = f" Fix: {self.fix}" if self.fix else ""
        return f"{self.state.value:<4}  {self.name}: {text}{fix}"


def nvml(spec: str | None, versions: tuple[str, str, int] | None, error: str) -> Layer:
    """`versions`: (driver, CUDA, GPUs) when NVML answered."""
    if spec is None:
        return Layer("nvml", State.SKIP, "not on the node (pass --devices nvml to check it here)")
    if versions is None:
        return Layer("nvml", State.FAIL, f"NVML does not answer: {error}.", nvml_fix(error))
    driver, cuda, gpus = versions
    fake = " (fake devices)" if spec.startswith("fake:") else ""
    if gpus == 0:
        return Layer(
            "nvml",
            State.FAIL,
            f"driver {driver} answers but sees no GPU{fake}.",
            "check the GPUs are visible to the driver (nvidia-smi -L) and not held by vfio",
        )
    many = "" if gpus == 1 else "s"
    return Layer("nvml", State.OK, f"driver {driver}, CUDA {cuda}, {gpus} GPU{many}{fake}")


def nvml_fix(error: str) -> str:
    """The fix for an NVML that does not answer, from its error."""
    low = error.lower()
    if "mismatch" in low or "different versions" in low:
        return (
            "the kernel module and libnvidia-ml differ in version: reboot, or reload "
            "the nvidia module, after a driver upgrade"
        )
    if "libnvidia-ml" in low or "not found" in low or "shared library" in low:
        return (
            "install the NVIDIA driver on the node, or point the plugin at its root "
            "(Helm driverRoot) when it lives elsewhere (e.g. /run/nvidia/driver)"
        )
    return "check that the NVIDIA driver is loaded (nvidia-smi on the node)"


def cdi(
    cdi_dir: str,
    writable_error: str | None,
    runtime: tuple[str, str] | None,
    *,
    runtime_reads: str = "",
) -> Layer:
    """`runtime`: (path, text) of containerd's config when readable; `runtime_reads`:
    where there is no containerd, what says the runtime reads `cdi_dir` (a dev node's)."""
    if writable_error is not None:
        return Layer(
            "cdi",
            State.FAIL,
            f"{cdi_dir} is not writable: {writable_error}.",
            "mount the CDI directory read-write into the plugin (Helm cdiDir), or pass "
            "--cdi-dir a writable directory the runtime reads",
        )
    if runtime is None:
        said = runtime_reads or "runtime CDI setting not readable here"
        return Layer("cdi", State.OK, f"{cdi_dir} writable; {said}")
    path, text = runtime
    verdict = containerd_cdi(text, cdi_dir)
    if verdict:
        return Layer(
            "cdi",
            State.FAIL,
            f"{path}: {verdict}.",
            "set enable_cdi = true (and cdi_spec_dirs to include "
            f"{cdi_dir}) in containerd's CRI plugin section, then restart containerd",
        )
    return Layer("cdi", State.OK, f"{cdi_dir} writable; containerd has CDI on ({path})")


def driver_files(mode: str, release: str, path: str, *, spec: Mapping[str, Any] | None) -> Layer:
    """The node's driver spec (--driver-files cdi): there, and for the driver NVML
    reports (`release`; "" when NVML did not answer). `spec`: its parsed JSON, if any."""
    if mode == "runtime":
        return Layer(
            "driver-files",
            State.OK,
            "runtime: NVIDIA's container runtime (legacy mode) is to add the driver's files",
        )
    if spec is None:
        return Layer(
            "driver-files",
            State.FAIL,
            f"no driver spec at {path}: containers get device nodes and no driver.",
            "the plugin writes it at start and at each rediscovery; its log says why not "
            "(`driver spec not written`): usually driverRoot is not where the driver is",
        )
    devices = spec.get("devices") or [{}]
    env = (devices[0].get("containerEdits") or {}).get("env") or []
    written = next(
        (e.split("=", 1)[1] for e in env if e.startswith("DRADRIVER_DRIVER_VERSION=")), ""
    )
    if release and written != release:
        return Layer(
            "driver-files",
            State.FAIL,
            f"{path} is for driver {written or '?'}, NVML reports {release}.",
            "the plugin rewrites it at its next rediscovery: send it SIGHUP, or restart it",
        )
    edits = spec.get("containerEdits") or {}
    hooks = sorted({h.get("path", "?") for h in edits.get("hooks") or []})
    return Layer(
        "driver-files",
        State.OK,
        f"{path}: driver {written}, {plural(len(edits.get('mounts') or []), 'file')}, hooks "
        f"by {', '.join(hooks) or 'none'}",
    )


def containerd_cdi(text: str, cdi_dir: str) -> str:
    """Empty when containerd's config turns CDI on and reads our directory."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return f"not valid TOML ({exc})"
    plugins = doc.get("plugins", {})
    # containerd 2 (config version 3) has CDI on by default; 1.7 (version 2) has it off.
    default_on = int(doc.get("version", 1)) >= 3
    sections = [
        plugins.get("io.containerd.cri.v1.runtime", {}),
        plugins.get("io.containerd.grpc.v1.cri", {}),
    ]
    enabled = next((s["enable_cdi"] for s in sections if "enable_cdi" in s), default_on)
    if not enabled:
        return "CDI is off in containerd (enable_cdi is not true)"
    dirs = next((s["cdi_spec_dirs"] for s in sections if "cdi_spec_dirs" in s), None)
    if dirs is not None and cdi_dir.rstrip("/") not in [d.rstrip("/") for d in dirs]:
        return f"containerd reads CDI specs from {', '.join(dirs)}, not {cdi_dir}"
    return ""


def dev_summary(nodes: Sequence[tuple[str, Layer | None]]) -> str:
    """The last line of a dev cluster's walk: each node with its first broken layer."""
    bad = [(name, layer) for name, layer in nodes if layer is not None]
    checked = f"{len(nodes)} dev node{'' if len(nodes) == 1 else 's'} checked"
    if not bad:
        return f"{checked}: every layer of each is ok"
    named = ", ".join(f"{name} ({layer.name})" for name, layer in bad)
    return f"{checked}: {len(bad)} broken: {named}; each one's fix is on its FAIL line above"


# Public: doctor_cluster.py counts slices and devices with it too.
def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"

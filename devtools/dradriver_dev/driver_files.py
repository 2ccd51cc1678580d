"""What a plugin on a fake node needs for --driver-files cdi, where no NVIDIA driver is
installed: NVIDIA's toolkit as tools/nvcdi builds it (dradriver-nvcdi and nvidia-cdi-hook,
cached), and a fake driver root of the fake GPUs' driver version (fakenvml.driver_root),
laid out once in the cache. The demo, the test beds and the benchmarks use both."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from dradriver_dev.cluster import REPO_ROOT
from fakenvml.driver_root import lay_out
from fakenvml.machine import DEFAULT_DRIVER_VERSION

BUILD = REPO_ROOT / "tools" / "nvcdi" / "build.sh"


def cache_dir() -> Path:
    base = os.environ.get("DRADRIVER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dradriver"
    )
    return Path(base)


@functools.cache
def tools_dir() -> Path:
    """The directory holding dradriver-nvcdi and nvidia-cdi-hook (built on first use)."""
    proc = subprocess.run(["bash", str(BUILD)], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{BUILD} failed (exit {proc.returncode}); its output is above")
    return Path(proc.stdout.strip().splitlines()[-1])


def fake_driver_root(version: str = DEFAULT_DRIVER_VERSION) -> Path:
    """A driver root holding driver `version`'s files, shared by every fake node (read
    only; a test that upgrades a driver lays out a root of its own)."""
    root = cache_dir() / "driver-root" / version
    if not (root / ".complete").exists():
        tmp = root.with_name(f".{version}.{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        lay_out(tmp, version)
        (tmp / ".complete").touch()
        try:
            tmp.rename(root)
        except OSError:  # another process laid it out first
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def driver_version(devices: str) -> str:
    """The driver version fake GPUs of `devices` report (a fleet file may set one)."""
    from fakenvml.spec import parse

    return parse(devices).driver_version or DEFAULT_DRIVER_VERSION


def plugin_env(env: dict[str, str] | None = None, devices: str = "") -> dict[str, str]:
    """`env` (default: this process's) with the toolkit's binaries on PATH and, as the
    plugin's --driver-root unless it names one already, a fake driver root of the
    version the fake GPUs of `devices` report."""
    out = dict(os.environ if env is None else env)
    out["PATH"] = f"{tools_dir()}{os.pathsep}{out.get('PATH', '')}"
    version = driver_version(devices) if devices.startswith("fake:") else DEFAULT_DRIVER_VERSION
    out.setdefault("DRADRIVER_DRIVER_ROOT", str(fake_driver_root(version)))
    return out

"""A fake NVIDIA driver root: the files a driver install puts on a node, for one version,
laid out where NVIDIA's installer and its distribution packages put them, so that NVIDIA's
container toolkit (tools/nvcdi) finds them exactly as it finds a real driver's.

The files are stand-ins: each library a shared object that is only its SONAME (built with
the host's C compiler where there is one, so ldconfig in a container links and lists it as
it would the real one; else an empty file, which the toolkit still finds by name), each
command a shell script that says what it is. Which files, and their SONAMEs, are those of
NVIDIA's Linux driver README, "Installed Components" (download.nvidia.com/XFree86/
Linux-x86_64/570.86.15/README/installedcomponents.html), the compute and video part a
container is given; the GSP firmware is /lib/firmware/nvidia/<version>/ (same page).

    python -m fakenvml.driver_root ROOT [--driver-version 570.86.15]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fakenvml.machine import DEFAULT_DRIVER_VERSION

LIB_DIR = "usr/lib/x86_64-linux-gnu"
BIN_DIR = "usr/bin"
VERSIONED = "<version>"  # a SONAME that is the file's own name (the version in it)


@dataclass(frozen=True)
class Library:
    name: str  # the file is <name>.<version>
    soname: str  # the link ldconfig makes; VERSIONED where it is the file itself


# The README's compute and video components (libcuda's SONAME is libcuda.so.1, NVVM's
# libnvidia-nvvm.so.4; the internal GPU compiler library is versioned by the driver).
LIBRARIES = (
    Library("libcuda.so", "libcuda.so.1"),
    Library("libcudadebugger.so", "libcudadebugger.so.1"),
    Library("libnvidia-ml.so", "libnvidia-ml.so.1"),
    Library("libnvidia-ptxjitcompiler.so", "libnvidia-ptxjitcompiler.so.1"),
    Library("libnvidia-nvvm.so", "libnvidia-nvvm.so.4"),
    Library("libnvidia-gpucomp.so", VERSIONED),
    Library("libnvidia-opencl.so", "libnvidia-opencl.so.1"),
    Library("libnvidia-cfg.so", "libnvidia-cfg.so.1"),
    Library("libnvidia-allocator.so", "libnvidia-allocator.so.1"),
    Library("libnvcuvid.so", "libnvcuvid.so.1"),
    Library("libnvidia-encode.so", "libnvidia-encode.so.1"),
    Library("libnvidia-opticalflow.so", "libnvidia-opticalflow.so.1"),
)
COMMANDS = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
# GSP firmware of Turing and of Ampere and later (the README's "GSP firmware" entries).
FIRMWARE = ("gsp_tu10x.bin", "gsp_ga10x.bin")


def compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc")


def _shared_object(path: Path, soname: str, cc: str, scratch: Path) -> None:
    src = scratch / "empty.c"
    src.write_text("/* a stand-in for the NVIDIA driver's library */\n")
    subprocess.run(
        [cc, "-shared", "-nostdlib", f"-Wl,-soname,{soname}", "-o", str(path), str(src)],
        check=True,
        capture_output=True,
    )


def lay_out(root: Path, version: str = DEFAULT_DRIVER_VERSION, *, elf: bool = True) -> Path:
    """The driver's files for `version` under `root` (made; files of another version
    already there stay, as after a driver upgrade before the old one is removed). `elf`:
    shared objects where the host has a C compiler, else empty files."""
    libs, bins = root / LIB_DIR, root / BIN_DIR
    firmware = root / "lib" / "firmware" / "nvidia" / version
    for d in (libs, bins, firmware):
        d.mkdir(parents=True, exist_ok=True)
    cc = compiler() if elf else None
    with tempfile.TemporaryDirectory() as scratch:
        for lib in LIBRARIES:
            path = libs / f"{lib.name}.{version}"
            soname = path.name if lib.soname == VERSIONED else lib.soname
            if cc:
                _shared_object(path, soname, cc, Path(scratch))
            else:
                path.write_bytes(b"")
    for cmd in COMMANDS:
        path = bins / cmd
        path.write_text(f"#!/bin/sh\necho '{cmd} {version} (a stand-in: no GPU here)'\n")
        path.chmod(0o755)
    for name in FIRMWARE:
        (firmware / name).write_bytes(b"")
    return root


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fakenvml.driver_root", description=__doc__)
    p.add_argument("root", type=Path)
    p.add_argument("--driver-version", default=DEFAULT_DRIVER_VERSION)
    p.add_argument("--no-elf", action="store_true", help="empty files, even with a compiler")
    args = p.parse_args(argv)
    lay_out(args.root, args.driver_version, elf=not args.no_elf)
    print(args.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())

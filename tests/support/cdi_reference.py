"""The CDI reference library (tags.cncf.io/container-device-interface, what containerd
and CRI-O use), reached through tools/cdi's `cdi-resolve`, so the plugin's CDI specs are
checked by the code a container runtime runs rather than by our reading of it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "tools" / "cdi" / "build.sh"


class CDIError(Exception):
    """A device the library could not resolve; the text is the library's (containerd's
    "CDI device injection failed: ..." wording)."""


@dataclass(frozen=True)
class Edits:
    """What CDI injection did to a container's OCI spec."""

    env: tuple[str, ...]
    device_nodes: tuple[dict[str, Any], ...]
    mounts: tuple[dict[str, Any], ...]
    hooks: tuple[dict[str, Any], ...]


class ReferenceResolver:
    def __init__(self, binary: Path, timeout: float = 60.0) -> None:
        self.binary = binary
        self.timeout = timeout

    def _run(self, spec_dirs: Sequence[Path], args: list[str]) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.binary), *(f"--spec-dir={d}" for d in spec_dirs), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout)
        if proc.returncode not in (0, 1):
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def validate(self, spec_dirs: Sequence[Path]) -> list[str]:
        """One "PATH: ERROR" line per spec file the library rejects."""
        proc = self._run(spec_dirs, ["validate"])
        return proc.stderr.splitlines() if proc.returncode else []

    def resolve(self, spec_dirs: Sequence[Path], device_ids: Sequence[str]) -> Edits:
        proc = self._run(spec_dirs, ["resolve", *device_ids])
        if proc.returncode:
            raise CDIError(proc.stderr.strip())
        data = json.loads(proc.stdout)
        return Edits(
            env=tuple(data["env"]),
            device_nodes=tuple(data["deviceNodes"]),
            mounts=tuple(data["mounts"]),
            hooks=tuple(data["hooks"]),
        )


_resolver: ReferenceResolver | None = None


def reference_resolver() -> ReferenceResolver:
    """Builds cdi-resolve with tools/cdi/build.sh (a cache hit after the first time) and
    returns a resolver over it; skips the test where Go is not installed."""
    global _resolver
    if _resolver is None:
        proc = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True)
        if proc.returncode == 127:
            pytest.skip("go is not installed, so tools/cdi (the CDI reference) cannot be built")
        if proc.returncode != 0 or not proc.stdout.strip():
            raise RuntimeError(f"{BUILD_SCRIPT} failed (exit {proc.returncode})")
        _resolver = ReferenceResolver(Path(proc.stdout.strip().splitlines()[-1]) / "cdi-resolve")
    return _resolver

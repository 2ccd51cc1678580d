"""Versions as ResourceSlice `version` attributes need them (strict semver 2.0.0), and what a
driver version gives."""

from __future__ import annotations

import re

_NUMERIC = re.compile(r"[0-9]+")


def semver(raw: str) -> str:
    """NVIDIA driver versions like "535.104.05" or "550.54" -> "535.104.5", "550.54.0".

    Semver forbids leading zeros in numeric parts, and the API server rejects a version
    attribute that is not strict semver, so a driver "535.104.05" must not reach a slice
    as it is."""
    parts = raw.strip().split(".")
    if not parts or len(parts) > 3 or not all(_NUMERIC.fullmatch(p) for p in parts):
        raise ValueError(f"not a numeric version: {raw!r}")
    nums = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
    return ".".join(nums)


def cuda_version(encoded: int) -> str:
    """NVML's CUDA driver version integer (12040) -> "12.4.0"."""
    if encoded <= 0:
        raise ValueError(f"not a CUDA version: {encoded}")
    return f"{encoded // 1000}.{(encoded % 1000) // 10}.0"


def compute_capability(major: int, minor: int) -> str:
    return f"{major}.{minor}.0"


# The first driver branch with MPS v3 (servers, namespaces): NVIDIA's MPS documentation.
MPS_V3_FROM = 615


def mps_protocol(driver_version: str) -> int:
    """The MPS control protocol a driver speaks: 3 from r615 (per-share servers and
    namespaces), else 2."""
    major = driver_version.split(".", 1)[0]
    return 3 if major.isdigit() and int(major) >= MPS_V3_FROM else 2

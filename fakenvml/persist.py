"""The fake's hardware state on disk, so MIG instances outlive a plugin restart the way
they outlive a process on a real node. One process owns a node's file at a time."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

FORMAT = 1


def state_path(state_dir: Path, node: str) -> Path:
    return state_dir / f"fake-nvml-{node}.json"


def load(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"fake NVML state {path} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"fake NVML state {path} has an unknown format; delete it to start over")
    return doc


def save(path: Path, doc: dict[str, Any]) -> None:
    """Atomic: a reader sees the old state or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"format": FORMAT, **doc}, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

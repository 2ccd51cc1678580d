"""The health state on disk (<state dir>/health.json), so a plugin restart keeps an
unhealthy GPU tainted: the XID that made it unhealthy will not come again, and a GPU off
the bus cannot be described by NVML any more, so its last description is kept too.

Versioned and tolerant: a file this version cannot read is logged and ignored (the
plugin then starts with every GPU healthy until a probe says otherwise), never fatal.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dradriver.health.model import Fault, GpuHealth, HealthBook, Instance
from dradriver.inventory.model import Gpu, IdleGpuInstance, MigDevice, MigProfile
from dradriver.logs import get_logger

log = get_logger("health.store")
FORMAT = 1
FILE_NAME = "health.json"


@dataclass
class Saved:
    gpus: dict[str, GpuHealth] = field(default_factory=dict)
    last_known: dict[str, Gpu] = field(default_factory=dict)  # GPU UUID -> description


def _fault(d: dict[str, Any]) -> Fault:
    xid = d.get("xid")
    return Fault(str(d["reason"]), int(d["since"]), int(xid) if xid is not None else None)


def gpu_from_json(d: dict[str, Any]) -> Gpu:
    """Inventory.to_json's GPU, back."""
    return Gpu(
        **{
            **d,
            "mig_profiles": tuple(
                MigProfile(**{**p, "placements": tuple(p["placements"])}) for p in d["mig_profiles"]
            ),
            "mig_devices": tuple(MigDevice(**m) for m in d["mig_devices"]),
            "idle_gpu_instances": tuple(IdleGpuInstance(**i) for i in d["idle_gpu_instances"]),
        }
    )


class HealthStore:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> Saved:
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return Saved()
        except (OSError, ValueError) as exc:
            log.warning(
                "health state unreadable; starting from healthy",
                path=str(self.path),
                error=str(exc),
            )
            return Saved()
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            log.warning(
                "health state of another format; starting from healthy",
                path=str(self.path),
                format=doc.get("format") if isinstance(doc, dict) else None,
            )
            return Saved()
        out = Saved()
        for uuid, g in (doc.get("lastKnown") or {}).items():
            try:
                out.last_known[uuid] = gpu_from_json(g)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("one GPU's last description unreadable", gpu=uuid, error=repr(exc))
        for uuid, g in (doc.get("gpus") or {}).items():
            try:
                fault = _fault(g["fault"]) if g.get("fault") else None
                instances = tuple(
                    (Instance(int(i["profileId"]), int(i["placementStart"])), _fault(i["fault"]))
                    for i in g.get("instances") or []
                )
                out.gpus[uuid] = GpuHealth(fault=fault, instances=instances)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning(
                    "health state of one GPU unreadable; ignored", gpu=uuid, error=repr(exc)
                )
        return out

    def save(self, book: HealthBook, last_known: dict[str, Gpu]) -> None:
        """The faults of faulty GPUs (a healthy one needs nothing remembered) and every
        GPU's last description (a lost one is published from it; its NVLink peers keep
        their domain)."""
        gpus: dict[str, Any] = {}
        for uuid, g in book.gpus.items():
            if not g.faulty:
                continue
            gpus[uuid] = {
                "fault": asdict(g.fault) if g.fault else None,
                "instances": [
                    {
                        "profileId": i.profile_id,
                        "placementStart": i.placement_start,
                        "fault": asdict(f),
                    }
                    for i, f in g.instances
                ],
            }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                doc = {
                    "format": FORMAT,
                    "gpus": gpus,
                    "lastKnown": {u: asdict(k) for u, k in last_known.items()},
                }
                json.dump(doc, f, sort_keys=True)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

"""The simulator's record of prepared claims, kept on disk like the kubelet's DRA
manager checkpoint, so a restarted simulator still unprepares what it prepared."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dradriver.logs import get_logger

log = get_logger("kubeletsim.state")
VERSION = 1


@dataclass
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    # driver -> devices as the plugin returned them (requestNames, poolName, deviceName,
    # cdiDeviceIDs)
    devices: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    pods: set[str] = field(default_factory=set)

    def cdi_ids(self, request: str | None = None) -> list[str]:
        out: list[str] = []
        for devs in self.devices.values():
            for d in devs:
                if request is not None and request not in d["requestNames"]:
                    continue
                out += [i for i in d["cdiDeviceIDs"] if i not in out]
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "devices": self.devices,
            "pods": sorted(self.pods),
        }


class ClaimState:
    """Thread-safe map claim UID -> PreparedClaim, written through to a JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.RLock()
        self.claims: dict[str, PreparedClaim] = {}
        self._load()

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text())
            for c in data.get("claims", []):
                self.claims[c["uid"]] = PreparedClaim(
                    uid=c["uid"],
                    namespace=c["namespace"],
                    name=c["name"],
                    devices=c.get("devices", {}),
                    pods=set(c.get("pods", [])),
                )
        except FileNotFoundError:
            return
        except (ValueError, KeyError, TypeError) as exc:
            aside = self.path.with_suffix(".corrupt")
            os.replace(self.path, aside)
            log.error(
                "state file unreadable; moved aside",
                path=str(self.path),
                moved_to=str(aside),
                error=str(exc),
            )

    def save(self) -> None:
        with self._lock:
            data = {"version": VERSION, "claims": [c.to_json() for c in self.claims.values()]}
            tmp = self.path.with_suffix(".tmp")
            with open(tmp, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)

    def get(self, uid: str) -> PreparedClaim | None:
        with self._lock:
            return self.claims.get(uid)

    def put(self, claim: PreparedClaim) -> None:
        with self._lock:
            self.claims[claim.uid] = claim
            self.save()

    def add_pod(self, uid: str, pod_uid: str) -> None:
        with self._lock:
            self.claims[uid].pods.add(pod_uid)
            self.save()

    def remove(self, uid: str) -> None:
        with self._lock:
            self.claims.pop(uid, None)
            self.save()

    def snapshot(self) -> list[PreparedClaim]:
        with self._lock:
            return [
                PreparedClaim(c.uid, c.namespace, c.name, dict(c.devices), set(c.pods))
                for c in self.claims.values()
            ]

    def release_pod(self, pod_uid: str) -> list[PreparedClaim]:
        """Drops pod_uid from every claim; returns the claims no pod uses any more."""
        with self._lock:
            freed = []
            for c in self.claims.values():
                if pod_uid in c.pods:
                    c.pods.discard(pod_uid)
                    if not c.pods:
                        freed.append(c)
            self.save()
            return freed

"""Claim status: status.devices entries for our devices, written in the background.

Best effort by design: a prepare never waits for or fails on this write. Server-side
apply with the driver name as field manager makes the entries ours alone, so other
drivers' entries in the same claim are left untouched, and applying an empty list
removes exactly ours at unprepare.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from dradriver.k8s import Kube, KubeError, NotFound, path_for
from dradriver.kubeletplugin.plan import ClaimRef
from dradriver.kubeletplugin.records import PreparedDevice
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.status")


class StatusWriter:
    def __init__(self, kube: Kube, driver: str, retries: int = 3) -> None:
        self.kube = kube
        self.driver = driver
        self.retries = retries
        self._q: queue.Queue[tuple[ClaimRef, list[dict[str, Any]]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="claim-status", daemon=True)
        self._thread.start()

    def prepared(self, ref: ClaimRef, devices: list[PreparedDevice]) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        entries = [
            {
                "driver": self.driver,
                "pool": d.pool,
                "device": d.device,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "Prepared",
                        "message": "device prepared by the kubelet plugin",
                        "lastTransitionTime": now,
                    }
                ],
                "data": {"uuid": d.uuid, "cdiDeviceIDs": d.cdi_device_ids},
            }
            for d in devices
        ]
        self._q.put((ref, entries))

    def unprepared(self, ref: ClaimRef) -> None:
        self._q.put((ref, []))

    def close(self, timeout: float = 5.0) -> None:
        self._q.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            ref, entries = item
            for attempt in range(self.retries):
                try:
                    self._apply(ref, entries)
                    break
                except NotFound:
                    break  # the claim is gone: nothing to report on
                except KubeError as exc:
                    if exc.status == 403:
                        # The claim-status policy refuses writes to claims no longer
                        # allocated here (deallocated before this write): nothing to do.
                        log.info(
                            "claim status not written: refused",
                            claim=str(ref),
                            claim_uid=ref.uid,
                            error=exc.message,
                        )
                        break
                    if attempt == self.retries - 1:
                        log.warning(
                            "claim status not written",
                            claim=str(ref),
                            claim_uid=ref.uid,
                            error=exc.message,
                        )
                    time.sleep(0.2 * 2**attempt)

    def _apply(self, ref: ClaimRef, entries: list[dict[str, Any]]) -> None:
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
            "status": {"devices": entries},
        }
        self.kube.apply(
            path_for("resource.k8s.io/v1", "resourceclaims", ref.namespace, ref.name, "status"),
            body,
            field_manager=self.driver,
        )

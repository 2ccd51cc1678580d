"""Claim status: status.devices entries for our devices, off the prepare path and best
effort (a prepare never waits for or fails on this write): each prepared claim written
once, COALESCE seconds after its prepare, by server-side apply; nothing at unprepare.
Why: docs/design.md, "Prepare: read, plan, apply, record".
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from dradriver.k8s import Kube, KubeError, NotFound, path_for
from dradriver.kubeletplugin.state.records import ClaimRef, PreparedDevice
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.status")

# Long enough that a prepare followed by an unprepare (a pod that failed at once, a
# benchmark) costs the API server nothing; short next to a container's start.
COALESCE = 1.0


@dataclass
class _Pending:
    ref: ClaimRef
    entries: list[dict[str, Any]]
    due: float


class StatusWriter:
    def __init__(
        self, kube: Kube, driver: str, retries: int = 3, *, coalesce: float = COALESCE
    ) -> None:
        self.kube = kube
        self.driver = driver
        self.retries = retries
        self.coalesce = coalesce
        self._pending: dict[str, _Pending] = {}  # claim UID -> what to write, and when
        self._cond = threading.Condition()
        self._closed = False
        self.writes = 0  # for tests: API writes made
        self._thread = threading.Thread(target=self._run, name="claim-status", daemon=True)
        self._thread.start()

    def prepared(self, ref: ClaimRef, devices: list[PreparedDevice]) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        entries = [_entry(self.driver, d, now) for d in devices]
        # No notify: the writer looks at least twice per delay (waking its thread on every
        # prepare was a context switch in the prepare's answer, for a write due later).
        with self._cond:
            self._pending[ref.uid] = _Pending(ref, entries, time.monotonic() + self.coalesce)

    def unprepared(self, ref: ClaimRef) -> None:
        """A write not made yet is not needed any more; one made is dropped by the API
        server with the allocation."""
        with self._cond:
            self._pending.pop(ref.uid, None)

    def close(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)

    def _next(self) -> _Pending | None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                due = [p for p in self._pending.values() if p.due <= now]
                if due:
                    first = min(due, key=lambda p: p.due)
                    del self._pending[first.ref.uid]
                    return first
                nearest = min((p.due for p in self._pending.values()), default=now + 3600)
                self._cond.wait(min(max(nearest - now, 0.001), self.coalesce / 2))
            return None

    def _run(self) -> None:
        while (item := self._next()) is not None:
            for attempt in range(self.retries):
                try:
                    self._apply(item.ref, item.entries)
                    break
                except NotFound:
                    break  # the claim is gone: nothing to report on
                except KubeError as exc:
                    if exc.status == 403:
                        # The claim-status policy refuses writes to claims no longer
                        # allocated here (deallocated before this write): nothing to do.
                        log.info(
                            "claim status not written: refused",
                            claim=str(item.ref),
                            claim_uid=item.ref.uid,
                            error=exc.message,
                        )
                        break
                    if attempt == self.retries - 1:
                        log.warning(
                            "claim status not written",
                            claim=str(item.ref),
                            claim_uid=item.ref.uid,
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
        self.writes += 1
        self.kube.apply(
            path_for(
                "resource.k8s.io/v1",
                "resourceclaims",
                ref.namespace,
                name=ref.name,
                subresource="status",
            ),
            body,
            field_manager=self.driver,
        )


def _entry(driver: str, d: PreparedDevice, now: str) -> dict[str, Any]:
    """A status.devices entry; a share's is keyed by its shareID too (status.devices is
    a map on driver, pool, device and shareID)."""
    entry: dict[str, Any] = {
        "driver": driver,
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
    if d.imex is not None:
        # Prepared means this node's IMEX daemon answered READY: what the ComputeDomain
        # controller counts the node ready by.
        domain = f"{d.imex.namespace}/{d.imex.domain}"
        entry["conditions"][0].update(
            reason="IMEXDaemonReady",
            message=f"this node's IMEX daemon for ComputeDomain {domain} is ready",
        )
        entry["data"] = {
            "cdiDeviceIDs": d.cdi_device_ids,
            "computeDomain": domain,
            "channel": d.imex.channel,
            "peers": list(d.imex.peers),
        }
    if d.share is not None:
        entry["shareID"] = d.share.share_id
        limits = {}
        if d.share.memory_limit is not None:
            limits["memory"] = d.share.memory_limit
        if d.share.compute_limit is not None:
            limits["compute"] = d.share.compute_limit
        if limits:
            entry["data"]["limits"] = limits
            # What holds the share to them (docs/user-guide.md, "How the limits are enforced").
            held = []
            if d.share.pipe_dir:
                held.append("mps-namespace" if d.share.server_side else "mps-client-env")
            if d.share.pod_cgroups:
                held.append("pod-cgroup")
            if held:
                entry["data"]["enforcedBy"] = held
    return entry

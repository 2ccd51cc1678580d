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
RETRIES = 3
API = "resource.k8s.io/v1"


@dataclass
class _Pending:
    ref: ClaimRef
    entries: list[dict[str, Any]]
    due: float


class StatusWriter:
    def __init__(self, kube: Kube, driver: str, *, coalesce: float = COALESCE) -> None:
        self.kube = kube
        self.driver = driver
        self.coalesce = coalesce
        self._pending: dict[str, _Pending] = {}  # claim UID -> what to write, and when
        self._cond = threading.Condition()
        self._closed = False
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
        """The write due first, once it is due; None once closed."""
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                first = min(self._pending.values(), key=lambda p: p.due, default=None)
                if first is not None and first.due <= now:
                    return self._pending.pop(first.ref.uid)
                wait = self.coalesce if first is None else first.due - now
                self._cond.wait(min(wait, self.coalesce / 2))
            return None

    def _run(self) -> None:
        while (item := self._next()) is not None:
            ref = item.ref
            path = path_for(
                API, "resourceclaims", ref.namespace, name=ref.name, subresource="status"
            )
            body = {
                "apiVersion": API,
                "kind": "ResourceClaim",
                "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
                "status": {"devices": item.entries},
            }
            for attempt in range(RETRIES):
                try:
                    self.kube.apply(path, body, field_manager=self.driver)
                    break
                except NotFound:
                    break  # the claim is gone: nothing to report on
                except KubeError as exc:
                    fields = {"claim": str(ref), "claim_uid": ref.uid, "error": exc.message}
                    if exc.status == 403:
                        # The claim-status policy refuses writes to claims no longer
                        # allocated here (deallocated before this write): nothing to do.
                        log.info("claim status not written: refused", **fields)
                        break
                    if attempt == RETRIES - 1:
                        log.warning("claim status not written", **fields)
                    time.sleep(0.2 * 2**attempt)


def _entry(driver: str, d: PreparedDevice, now: str) -> dict[str, Any]:
    """A status.devices entry; a share's is keyed by its shareID too (status.devices is
    a map on driver, pool, device and shareID)."""
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "Prepared",
        "message": "device prepared by the kubelet plugin",
        "lastTransitionTime": now,
    }
    data: dict[str, Any] = {"uuid": d.uuid, "cdiDeviceIDs": d.cdi_device_ids}
    if d.imex is not None:
        # Prepared means this node's IMEX daemon answered READY: what the ComputeDomain
        # controller counts the node ready by.
        domain = f"{d.imex.namespace}/{d.imex.domain}"
        ready["reason"] = "IMEXDaemonReady"
        ready["message"] = f"this node's IMEX daemon for ComputeDomain {domain} is ready"
        data = {
            "cdiDeviceIDs": d.cdi_device_ids,
            "computeDomain": domain,
            "channel": d.imex.channel,
            "peers": list(d.imex.peers),
        }
    entry: dict[str, Any] = {
        "driver": driver,
        "pool": d.pool,
        "device": d.device,
        "conditions": [ready],
        "data": data,
    }
    if (share := d.share) is not None:
        entry["shareID"] = share.share_id
        asked = {"memory": share.memory_limit, "compute": share.compute_limit}
        if limits := {k: v for k, v in asked.items() if v is not None}:
            data["limits"] = limits
            # What holds the share to them (docs/user-guide.md, "How the limits are enforced").
            held = []
            if share.pipe_dir:
                held.append("mps-namespace" if share.server_side else "mps-client-env")
            if share.pod_cgroups:
                held.append("pod-cgroup")
            if held:
                data["enforcedBy"] = held
    return entry

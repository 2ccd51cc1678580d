"""Keeps the node's ResourceSlices equal to the desired set, with the fewest writes.

Pool bookkeeping follows the API's contract: consumers trust only the slices of the
newest pool generation, and only once they have seen resourceSliceCount of them. A
single update is atomic, so when at most one existing slice changes and none is added
the generation stays; any other change bumps the generation on every slice.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from dradriver.k8s import Conflict, Kube, KubeError, NotFound, path_for
from dradriver.k8s.server_line import ServerLine
from dradriver.logs import get_logger
from dradriver.slices.build import SliceContent
from dradriver.slices.taints import TAINTS_DROPPED, tainted, taints_dropped

log = get_logger("slices.publish")
RES = "resource.k8s.io/v1"
SLICES = path_for(RES, "resourceslices")
FINGERPRINT = "fingerprint"
# How long the first sync waits for a prefetch in flight (about one API request's timeout)
# before it asks itself.
PREFETCH_WAIT = 30.0


class PublishError(RuntimeError):
    pass


@dataclass
class SyncStats:
    created: int = 0
    updated: int = 0
    deleted: int = 0
    generation: int = 0
    devices: int = 0

    @property
    def writes(self) -> int:
        return self.created + self.updated + self.deleted


def slice_name(node: str, driver: str, key: str) -> str:
    """The key stays last: from 1.36 the allocator tries a pool's slices in name order,
    so the keys' order (build.py) is the order the node's slices are tried in."""
    name = f"{node}-{driver}-{key}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(f"{node}-{driver}".encode()).hexdigest()[:16]
    return f"{node[:200]}-{digest}-{key}"[:253]


def slice_object(
    driver: str,
    node: str,
    name: str,
    *,
    c: SliceContent,
    gen: int,
    count: int,
    owner: list[dict[str, Any]] | None = None,
    manager: str = "dradriver",
) -> dict[str, Any]:
    """The ResourceSlice object for one piece of desired content (pure)."""
    spec: dict[str, Any] = {
        "driver": driver,
        "nodeName": node,
        "pool": {"name": node, "generation": gen, "resourceSliceCount": count},
    }
    # From 1.35 a slice of counter sets must not name devices at all: an empty list is
    # "set" to the API server's validation.
    if c.devices or not c.shared_counters:
        spec["devices"] = list(c.devices)
    if c.shared_counters:
        spec["sharedCounters"] = list(c.shared_counters)
    meta: dict[str, Any] = {
        "name": name,
        "labels": {"app.kubernetes.io/managed-by": manager},
        "annotations": {f"{driver}/{FINGERPRINT}": c.fingerprint()},
    }
    if owner:
        meta["ownerReferences"] = owner
    return {"apiVersion": RES, "kind": "ResourceSlice", "metadata": meta, "spec": spec}


def render(
    driver: str, node: str, slices: Sequence[SliceContent], *, generation: int = 1
) -> list[dict[str, Any]]:
    """All of a node's slices as they would be published (for `dradriver devices`)."""
    return [
        slice_object(
            driver, node, slice_name(node, driver, c.key), c=c, gen=generation, count=len(slices)
        )
        for c in slices
    ]


SHARING_DROPPED = (
    "slices layer: the API server dropped allowMultipleAllocations and the capacities' "
    "requestPolicy, so every device goes to one claim at a time: enable the "
    "DRAConsumableCapacity feature gate on kube-apiserver, kube-scheduler and "
    "kube-controller-manager, or run with --consumable-capacity=off. Publishing goes on "
    "without them."
)


def _shared(devices: Sequence[Mapping[str, Any]]) -> int:
    return sum(1 for d in devices if d.get("allowMultipleAllocations"))


COUNTERS_DROPPED = (
    "slices layer: the API server dropped the MIG partitions' shared counters. "
    "Dynamic MIG mode needs the DRAPartitionableDevices feature gate on "
    "kube-apiserver, kube-scheduler and kube-controller-manager; enable it or "
    "run with --mig-mode static or none."
)


@dataclass
class SlicePublisher:
    kube: Kube
    driver: str
    node: str
    field_manager: str = "dradriver"
    # Told of every slice this publisher writes or deletes (the slice watch, so it can
    # tell our own changes from someone else's).
    on_written: Callable[[dict[str, Any]], None] | None = None
    on_deleted: Callable[[str], None] | None = None
    # Told when the API server refuses a slice as invalid: it may run another line now.
    server_line: ServerLine | None = None
    _node_uid: str = field(default="", init=False)
    # The API server dropped our device taints (DRADeviceTaints off): said once.
    taints_dropped: bool = field(default=False, init=False)
    # The API server dropped allowMultipleAllocations (DRAConsumableCapacity off): said once.
    sharing_dropped: bool = field(default=False, init=False)
    _prefetched: Future[list[dict[str, Any]]] | None = field(default=None, init=False)

    @property
    def annotation(self) -> str:
        return f"{self.driver}/{FINGERPRINT}"

    def _owner(self) -> list[dict[str, Any]]:
        if not self._node_uid:
            try:
                self._node_uid = self.kube.get(path_for("v1", "nodes", name=self.node))["metadata"][
                    "uid"
                ]
            except NotFound:
                return []  # no Node object (yet): publish without garbage collection
        return [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.node,
                "uid": self._node_uid,
                "controller": True,
            }
        ]

    def start_prefetch(self) -> None:
        """At startup, while discovery runs: the first sync's LIST of this node's slices
        and the Node's UID, fetched on a thread of their own, so that the first slice
        waits for neither (nor for the TLS handshake before them). A failure is the first
        sync's, as if it had asked itself."""
        prefetched: Future[list[dict[str, Any]]] = Future()
        self._prefetched = prefetched

        def fetch() -> None:
            try:
                self._owner()
                prefetched.set_result(self.existing())
            except Exception as exc:
                prefetched.set_exception(exc)

        threading.Thread(target=fetch, name="slices-prefetch", daemon=True).start()

    def _current(self) -> list[dict[str, Any]]:
        """What the API server holds: the prefetched list, once, else a fresh one. A
        prefetched list gone stale meanwhile only costs a conflict and a re-plan; a
        prefetch that failed fails this round (the loop retries it with a fresh LIST),
        rather than make it wait out the same unreachable server twice."""
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is not None:
            futures.wait([prefetched], PREFETCH_WAIT)
            if prefetched.done():
                return prefetched.result()  # or raises what the prefetch met
        return self.existing()

    def existing(self) -> list[dict[str, Any]]:
        return list(
            self.kube.list(
                SLICES,
                fieldSelector=f"spec.nodeName={self.node},spec.driver={self.driver}",
            ).get("items", [])
        )

    def sync(self, desired: Sequence[SliceContent], attempts: int = 5) -> SyncStats:
        for attempt in range(attempts):
            try:
                return self._sync_once(desired)
            except KubeError as exc:
                if exc.status == 422 and self.server_line is not None:
                    self.server_line.forget()
                if not isinstance(exc, Conflict):
                    raise
                # Another writer (a second plugin instance during a rolling update) got
                # there first: look again and redo the plan.
                log.info(
                    "slice write conflict; re-planning",
                    node=self.node,
                    attempt=attempt + 1,
                    error=exc.message,
                )
        raise PublishError(
            f"gave up publishing slices of {self.node} after {attempts} conflicting writes"
        )

    def _sync_once(self, desired: Sequence[SliceContent]) -> SyncStats:
        current = self._current()
        gen = max((int(s["spec"]["pool"]["generation"]) for s in current), default=0)
        want = {slice_name(self.node, self.driver, c.key): c for c in desired}
        by_name = {s["metadata"]["name"]: s for s in current}
        obsolete = [
            s
            for n, s in by_name.items()
            if n not in want or int(s["spec"]["pool"]["generation"]) < gen
        ]
        matched = {n: by_name[n] for n in want if n in by_name and by_name[n] not in obsolete}
        new = [n for n in want if n not in matched]
        count = len(want)

        def stale(s: dict[str, Any], c: SliceContent) -> bool:
            pool = s["spec"]["pool"]
            return (
                s["metadata"].get("annotations", {}).get(self.annotation) != c.fingerprint()
                or int(pool["resourceSliceCount"]) != count
            )

        changed = [n for n, s in matched.items() if stale(s, want[n])]
        if gen == 0 or new or len(changed) > 1:
            gen += 1
            changed = list(matched)
        stats = SyncStats(generation=gen, devices=sum(len(c.devices) for c in desired))
        counted = next((c for c in desired if c.shared_counters), None)
        if counted is not None and (new or changed):
            self._check_counters_survive(counted, gen, count)
        # Remove first: better to briefly offer fewer devices than devices that are gone.
        for s in obsolete:
            self._deleting(s["metadata"]["name"])
            self.kube.delete(
                f"{SLICES}/{s['metadata']['name']}", missing_ok=True, uid=s["metadata"]["uid"]
            )
            stats.deleted += 1
        for n in changed:
            body = self._object(n, want[n], gen, count=count)
            body["metadata"]["resourceVersion"] = matched[n]["metadata"]["resourceVersion"]
            self._check_kept(self._written(self.kube.replace(f"{SLICES}/{n}", body)), want[n])
            stats.updated += 1
        for n in new:
            stored = self.kube.create(SLICES, self._object(n, want[n], gen, count=count))
            self._check_kept(self._written(stored), want[n])
            stats.created += 1
        if stats.writes:
            log.info(
                "slices published",
                node=self.node,
                driver=self.driver,
                generation=gen,
                slices=count,
                devices=stats.devices,
                created=stats.created,
                updated=stats.updated,
                deleted=stats.deleted,
            )
        return stats

    def _written(self, stored: dict[str, Any]) -> dict[str, Any]:
        if self.on_written:
            self.on_written(stored)
        return stored

    def _deleting(self, name: str) -> None:
        if self.on_deleted:
            self.on_deleted(name)

    def _object(self, name: str, c: SliceContent, gen: int, *, count: int) -> dict[str, Any]:
        return slice_object(
            self.driver,
            self.node,
            name,
            c=c,
            gen=gen,
            count=count,
            owner=self._owner(),
            manager=self.field_manager,
        )

    def _check_counters_survive(self, c: SliceContent, gen: int, count: int) -> None:
        """A dry-run create first: without DRAPartitionableDevices the API server drops
        shared counters, and a slice of partitions without them must never be visible to
        the scheduler, not even between a write and its check."""
        probe = self._object(slice_name(self.node, self.driver, "gate-check"), c, gen, count=count)
        stored = self.kube.request("POST", SLICES, query={"dryRun": "All"}, body=probe)
        if not stored.get("spec", {}).get("sharedCounters"):
            raise PublishError(COUNTERS_DROPPED)

    def _check_kept(self, stored: dict[str, Any], c: SliceContent) -> None:
        """An API server without DRAPartitionableDevices silently drops shared counters,
        and partitions without counters would let the scheduler hand out overlapping MIG
        slices. Refuse to leave such a slice behind."""
        if c.shared_counters and not stored["spec"].get("sharedCounters"):
            self._deleting(stored["metadata"]["name"])
            self.kube.delete(f"{SLICES}/{stored['metadata']['name']}", missing_ok=True)
            raise PublishError(COUNTERS_DROPPED)
        # Taints are kept publishing without: a device the scheduler may still hand out
        # beats a node that offers nothing; the log says which gate to enable.
        if _shared(c.devices) and not _shared(stored["spec"].get("devices") or []):
            if not self.sharing_dropped:
                log.warning(SHARING_DROPPED, node=self.node, shared=_shared(c.devices))
            self.sharing_dropped = True
        if taints_dropped(c, stored):
            if not self.taints_dropped:
                log.warning(TAINTS_DROPPED, node=self.node, tainted=tainted(c.devices))
            self.taints_dropped = True
        elif tainted(c.devices):
            self.taints_dropped = False

    def delete_all(self) -> int:
        n = 0
        for s in self.existing():
            self._deleting(s["metadata"]["name"])
            self.kube.delete(f"{SLICES}/{s['metadata']['name']}", missing_ok=True)
            n += 1
        return n

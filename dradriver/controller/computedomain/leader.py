"""One writer among the controller's replicas: the official library's leader election
(kubernetes.leaderelection: its acquire and renew loop, its record) over a
coordination.k8s.io Lease, read and written through our Kube so that the Lease goes
with the same credentials, proxies and retries as every other request (the library's
own LeaseLock would build a second ApiClient from the default configuration).

The library's loop never returns while it cannot acquire, and has no stop; it runs in
a daemon thread, and stop() hands the Lease over at once (an empty holder, which the
other replicas take without waiting out the lease) instead of leaving them waiting
lease_duration seconds.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from dradriver.k8s import Kube, KubeError, NotFound, path_for
from dradriver.logs import get_logger

log = get_logger("controller.leader")

COORD = "coordination.k8s.io/v1"
# client-go's defaults for controllers (15 s lease, 10 s renew deadline, 2 s retry).
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 15, 10, 2
MICROTIME = "%Y-%m-%dT%H:%M:%S.%fZ"

# The library logs every retry of a follower at INFO (each 2 s, forever).
logging.getLogger("leaderelection").setLevel(logging.WARNING)


class _Missing:
    """What the library's loop reads from a failed get: a 404 body lets it create."""

    def __init__(self, code: int, reason: str) -> None:
        self.body = json.dumps({"code": code})
        self.reason = reason


def _lease_lock_base() -> type:
    from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

    base: type = LeaseLock
    return base


def make_lock(kube: Kube, namespace: str, name: str, *, identity: str) -> Any:
    """A lock with the library's LeaseLock interface (get, create, update) and its time
    conversions, whose requests are ours."""
    base = _lease_lock_base()

    class KubeLeaseLock(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            # Not the base's __init__: it builds the library's API client, unused here.
            self.name, self.namespace, self.identity = name, namespace, identity
            self.lease: dict[str, Any] | None = None

        def path(self, with_name: bool = True) -> str:
            return path_for(COORD, "leases", self.namespace, name=self.name if with_name else None)

        def get(self, name: str, namespace: str) -> tuple[bool, Any]:
            try:
                self.lease = kube.get(self.path())
            except KubeError as exc:
                return False, _Missing(
                    404 if isinstance(exc, NotFound) else exc.status, exc.message
                )
            return True, self._record(self.lease.get("spec") or {})

        def create(self, name: str, namespace: str, election_record: Any) -> bool:
            body = {
                "apiVersion": COORD,
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(election_record),
            }
            try:
                self.lease = kube.create(self.path(with_name=False), body)
            except KubeError as exc:
                log.info("creating the lease failed", lease=self.name, error=exc.message)
                return False
            return True

        def update(self, name: str, namespace: str, updated_record: Any) -> bool:
            if self.lease is None:
                return False
            body = dict(
                self.lease, spec=dict(self.lease.get("spec") or {}, **self._spec(updated_record))
            )
            try:
                # A replace carries the resourceVersion read: two replicas cannot both win.
                self.lease = kube.replace(self.path(), body)
            except KubeError as exc:
                log.info("updating the lease failed", lease=self.name, error=exc.message)
                return False
            return True

        def release(self) -> None:
            ok, record = self.get(self.name, self.namespace)
            if not ok or record.holder_identity != self.identity or self.lease is None:
                return
            spec = dict(self.lease.get("spec") or {}, holderIdentity="", leaseDurationSeconds=1)
            try:
                self.lease = kube.replace(self.path(), dict(self.lease, spec=spec))
            except KubeError as exc:
                log.warning("releasing the lease failed", lease=self.name, error=exc.message)
                return
            log.info("released the lease", lease=self.name, identity=self.identity)

        def _spec(self, record: Any) -> dict[str, Any]:
            return {
                "holderIdentity": record.holder_identity,
                "leaseDurationSeconds": int(record.lease_duration),
                "acquireTime": self.time_str_to_iso(record.acquire_time).strftime(MICROTIME),
                "renewTime": self.time_str_to_iso(record.renew_time).strftime(MICROTIME),
            }

        def _record(self, spec: dict[str, Any]) -> Any:
            from kubernetes.leaderelection.leaderelectionrecord import LeaderElectionRecord

            def when(key: str) -> str | None:
                v = spec.get(key)
                return self.time_from_utc(_parse(v)) if isinstance(v, str) else None

            dur = spec.get("leaseDurationSeconds")
            return LeaderElectionRecord(
                spec.get("holderIdentity") or None,
                str(dur) if dur else None,
                when("acquireTime"),
                when("renewTime"),
            )

    return KubeLeaseLock()


def _parse(v: str) -> datetime:
    from datetime import UTC

    text = v.rstrip("Z")
    fmt = "%Y-%m-%dT%H:%M:%S.%f" if "." in text else "%Y-%m-%dT%H:%M:%S"
    return datetime.strptime(text, fmt).replace(tzinfo=UTC)


class Election:
    """Calls `lead(leading)` in a thread each time this replica becomes the leader;
    `leading` is cleared when it stops being one, and `lead` must then return."""

    def __init__(self, kube: Kube, namespace: str, name: str, *, identity: str) -> None:
        self.lock = make_lock(kube, namespace, name, identity=identity)
        self.identity = identity
        self.leading = threading.Event()

    def start(self, lead: Callable[[threading.Event], None], stop: threading.Event) -> None:
        threading.Thread(
            target=self._loop, args=(lead, stop), name="leader-election", daemon=True
        ).start()

    def _loop(self, lead: Callable[[threading.Event], None], stop: threading.Event) -> None:
        from kubernetes.leaderelection import electionconfig, leaderelection

        def started() -> None:
            self.leading.set()
            log.info(
                "leading", identity=self.identity, lease=f"{self.lock.namespace}/{self.lock.name}"
            )
            lead(self.leading)

        def stopped() -> None:
            if self.leading.is_set():
                log.warning("lost the lease; stopped reconciling", identity=self.identity)
            self.leading.clear()

        while not stop.is_set():
            config = electionconfig.Config(
                self.lock, LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD, started, stopped
            )
            leaderelection.LeaderElection(config).run()
            stopped()
            stop.wait(RETRY_PERIOD)

    def release(self) -> None:
        """Gives the Lease up if this replica holds it, so another takes over at once."""
        if self.leading.is_set():
            self.leading.clear()
            self.lock.release()

"""The kubelet's services (registration, DRA v1 and v1beta1, health v1 and v1alpha1) as
grpcio asyncio servicers: each translates messages to and from the driver's plain
values, and runs the driver's blocking work on a thread pool, never on the loop; a call
cancelled while it waits for a slot never reaches the preparer (docs/design.md, "The gRPC
servers"). And the preparer as the DRA socket sees it (LatePreparer): the sockets are up
before discovery, the checkpoint and the API client are, and a call that comes meanwhile
waits for them (within its deadline) instead of finding no socket."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import grpc
import grpc.aio

from dradriver.api import kubelet as kapi
from dradriver.kubeletplugin.grpc_edge.health_feed import HealthFeed
from dradriver.kubeletplugin.state.records import ClaimRef
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.grpc")

# The DRA services first: the kubelet takes the first DRA service of this list it knows,
# skipping names it does not (the health services on 1.34 to 1.36). 1.37 watches health
# only where a health service is named, picking by its own preference (v1 first); the
# order here says ours the same way.
VERSIONS = [kapi.DRA_V1, kapi.DRA_V1BETA1, kapi.DRA_HEALTH_V1, kapi.DRA_HEALTH_V1ALPHA1]
T = TypeVar("T")
Context = grpc.aio.ServicerContext[Any, Any]


class Result(Protocol):
    error: str

    @property
    def devices(self) -> Sequence[Any]: ...


class Preparer(Protocol):
    """What the DRA socket serves: prepare.Preparer."""

    def prepare(self, refs: list[ClaimRef]) -> Mapping[str, Result]: ...

    def unprepare(self, refs: list[ClaimRef]) -> Mapping[str, str]: ...


class Work:
    """The preparer's thread pool, `size` calls at a time; shared by every servicer of a
    server."""

    def __init__(self, size: int, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix=name)
        self._slots = asyncio.Semaphore(size)  # bound to the loop that first waits on it
        self.last_call = 0.0  # when the latest call came (time.monotonic())

    async def run(self, context: Context, fn: Callable[[], T]) -> T:
        """fn() on the pool, once a slot is free. A call that ended before its turn
        came is cancelled (grpcio's answer to a cancelled handler: nothing is sent)."""
        self.last_call = time.monotonic()
        async with self._slots:
            if context.done():
                raise asyncio.CancelledError
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _refs(request: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, uid=c.uid, name=c.name) for c in request.claims]


class _DraCalls(kapi.dra_v1_grpc.DRAPluginServicer, kapi.dra_v1beta1_grpc.DRAPluginServicer):
    """DRAPlugin of either version: v1 and v1beta1 carry the same messages, from `msgs`."""

    def __init__(self, msgs: Any, preparer: Preparer, work: Work) -> None:
        self._msgs, self._preparer, self._work = msgs, preparer, work
        # v1 only (1.35's field): v1beta1 has no way to say which share an entry is.
        self._shares = "share_id" in msgs.Device.DESCRIPTOR.fields_by_name

    def _prepare(self, request: Any) -> Any:
        resp = self._msgs.NodePrepareResourcesResponse()
        for uid, result in self._preparer.prepare(_refs(request)).items():
            entry = resp.claims[uid]
            if result.error:
                entry.error = result.error
                continue
            for d in result.devices:
                device = entry.devices.add(
                    request_names=d.request_names,
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=d.cdi_device_ids,
                )
                # A share (consumable capacity) is its own entry, named by the
                # allocation's shareID, which the kubelet keeps and reports through the
                # PodResources API; a device held whole leaves the field unset.
                share = getattr(d, "share", None)
                if self._shares and share is not None and share.share_id:
                    device.share_id = share.share_id
        return resp

    def _unprepare(self, request: Any) -> Any:
        resp = self._msgs.NodeUnprepareResourcesResponse()
        for uid, error in self._preparer.unprepare(_refs(request)).items():
            resp.claims[uid].error = error
        return resp

    async def _call(
        self, method: str, fn: Callable[[Any], Any], request: Any, *, context: Context
    ) -> Any:
        try:
            return await self._work.run(context, lambda: fn(request))
        except Exception as exc:  # a cancelled call (CancelledError) is no Exception
            # The preparer answers each claim's failure in its entry; an exception is a bug
            # in the plugin, and the kubelet retries the call.
            claims = ",".join(f"{c.namespace}/{c.name}" for c in request.claims)
            error = f"{type(exc).__name__}: {exc}"
            log.error("DRA call failed", method=method, claims=claims, error=error, exc=True)
            await context.abort(
                grpc.StatusCode.INTERNAL, f"kubelet plugin: {method} failed: {error}"
            )

    async def NodePrepareResources(self, request: Any, context: Context) -> Any:
        return await self._call("NodePrepareResources", self._prepare, request, context=context)

    async def NodeUnprepareResources(self, request: Any, context: Context) -> Any:
        return await self._call("NodeUnprepareResources", self._unprepare, request, context=context)


class RegistrationServicer(kapi.registration_grpc.RegistrationServicer):
    """pluginregistration.Registration: what the kubelet's plugin watcher asks."""

    def __init__(
        self, driver_name: str, endpoint: str, on_status: Callable[[bool, str], None], *, work: Work
    ) -> None:
        self._preparer_name, self._endpoint = driver_name, endpoint
        self._on_status, self._work = on_status, work

    async def GetInfo(self, request: Any, context: Context) -> kapi.registration.PluginInfo:
        return kapi.registration.PluginInfo(
            type=kapi.DRA_PLUGIN_TYPE,
            name=self._preparer_name,
            endpoint=self._endpoint,
            supported_versions=VERSIONS,
        )

    async def NotifyRegistrationStatus(
        self, request: kapi.registration.RegistrationStatus, context: Context
    ) -> kapi.registration.RegistrationStatusResponse:
        ok, error = bool(request.plugin_registered), str(request.error)
        # The plugin's answer to it (a republish, a metric) takes locks: off the loop.
        await self._work.run(context, lambda: self._on_status(ok, error))
        return kapi.registration.RegistrationStatusResponse()


class _Health(
    kapi.health_v1_grpc.DRAResourceHealthServicer,
    kapi.health_v1alpha1_grpc.DRAResourceHealthServicer,
):
    """DRAResourceHealth of either version (1.37 kubelets prefer v1, 1.34 to 1.36 call
    v1alpha1), served from `feed` with the messages of `msgs`."""

    def __init__(self, feed: HealthFeed, msgs: Any) -> None:
        self._feed, self._msgs = feed, msgs
        # The name the registration lists (DRA_HEALTH_V1, DRA_HEALTH_V1ALPHA1).
        self._service = msgs.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name

    async def NodeWatchResources(self, request: Any, context: Context) -> AsyncIterator[Any]:
        # Which version a kubelet watches is what tells a 1.37 node (v1) from an older one.
        log.info("the kubelet watches device health", service=self._service)
        try:
            async for message in self._feed.stream(self._msgs):
                yield message
        finally:
            log.debug("device health stream ended", service=self._service)


def serve_dra(server: grpc.aio.Server, preparer: Preparer, work: Work, *, feed: HealthFeed) -> None:
    """Adds the DRA socket's services to `server`: DRA v1 and v1beta1 (their calls go to
    `preparer` through `work`), health v1 and v1alpha1 (from `feed`)."""
    for msgs, stubs in ((kapi.dra_v1, kapi.dra_v1_grpc), (kapi.dra_v1beta1, kapi.dra_v1beta1_grpc)):
        stubs.add_DRAPluginServicer_to_server(_DraCalls(msgs, preparer, work), server)
    for msgs, stubs in (
        (kapi.health_v1, kapi.health_v1_grpc),
        (kapi.health_v1alpha1, kapi.health_v1alpha1_grpc),
    ):
        stubs.add_DRAResourceHealthServicer_to_server(_Health(feed, msgs), server)


@dataclass
class _NotReady:
    error: str
    devices: list[Any] = field(default_factory=list)


class LatePreparer:
    """A Preparer whose real one is set once startup has built it."""

    def __init__(self, patience: float = 30.0) -> None:
        self.patience = patience
        self._preparer: Preparer | None = None
        self._ready = threading.Event()
        self.reason: Callable[[], str] = lambda: "starting"

    def set(self, preparer: Preparer) -> None:
        self._preparer = preparer
        self._ready.set()

    def _not_ready(self, ref: ClaimRef) -> str:
        return f"claim {ref}: the plugin is still starting ({self.reason()}); the kubelet retries"

    def prepare(self, refs: list[ClaimRef]) -> Mapping[str, Result]:
        if self._ready.wait(self.patience) and self._preparer is not None:
            return self._preparer.prepare(refs)
        return {r.uid: _NotReady(self._not_ready(r)) for r in refs}

    def unprepare(self, refs: list[ClaimRef]) -> Mapping[str, str]:
        if self._ready.wait(self.patience) and self._preparer is not None:
            return self._preparer.unprepare(refs)
        return {r.uid: self._not_ready(r) for r in refs}


class RegistrationHooks:
    """The kubelet's registration answers, kept until the plugin is wired to hear them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fn: Callable[[bool, str], None] | None = None
        self._last: tuple[bool, str] | None = None

    # Answers are handed on under the lock: one at a time and in the kubelet's order, the
    # one kept before attach() included.
    def notify(self, ok: bool, error: str) -> None:
        with self._lock:
            self._last = (ok, error)
            if self._fn is not None:
                self._fn(ok, error)

    def attach(self, fn: Callable[[bool, str], None]) -> None:
        with self._lock:
            self._fn = fn
            if self._last is not None:
                fn(*self._last)

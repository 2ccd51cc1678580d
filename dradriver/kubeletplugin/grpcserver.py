"""The two gRPC endpoints the kubelet talks to: the registration socket in its plugin
registry and the DRA socket (v1 and v1beta1 on one server).

Socket names carry an instance id so two plugin instances can run side by side during a
rolling update; the kubelet prefers the newest. If our registration socket disappears
(someone cleaned the registry), it is recreated within a second, so a kubelet restart
never leaves the node without the driver; so is the DRA socket.

Both are served by the plugin's own small gRPC server (rpc/), not grpcio's.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from dradriver.api import kubelet as kapi
from dradriver.kubeletplugin.claimref import ClaimRef
from dradriver.kubeletplugin.health_service import HealthFeed
from dradriver.kubeletplugin.rpc.listener import bind_unix
from dradriver.logs import get_logger

if TYPE_CHECKING:
    from dradriver.kubeletplugin.rpc.server import RpcServer

log = get_logger("kubeletplugin.grpc")


class Result(Protocol):
    error: str

    @property
    def devices(self) -> Sequence[Any]: ...


class Driver(Protocol):
    """What the DRA socket serves: prepare.Preparer."""

    def prepare(self, refs: list[ClaimRef]) -> Mapping[str, Result]: ...

    def unprepare(self, refs: list[ClaimRef]) -> Mapping[str, str]: ...


@dataclass
class _NotReady:
    error: str
    devices: list[Any] = field(default_factory=list)


class LateDriver:
    """The DRA socket's driver from the process's first instant: the sockets are up
    before discovery, the checkpoint and the API client are, and a call that comes
    meanwhile waits for them (within its deadline) instead of finding no socket."""

    def __init__(self, patience: float = 30.0) -> None:
        self.patience = patience
        self._driver: Driver | None = None
        self._ready = threading.Event()
        self.reason: Callable[[], str] = lambda: "starting"

    def set(self, driver: Driver) -> None:
        self._driver = driver
        self._ready.set()

    def _wait(self) -> Driver | None:
        self._ready.wait(self.patience)
        return self._driver

    def _not_ready(self, ref: ClaimRef) -> str:
        return f"claim {ref}: the plugin is still starting ({self.reason()}); the kubelet retries"

    def prepare(self, refs: list[ClaimRef]) -> Mapping[str, Result]:
        driver = self._wait()
        if driver is None:
            return {r.uid: _NotReady(self._not_ready(r)) for r in refs}
        return driver.prepare(refs)

    def unprepare(self, refs: list[ClaimRef]) -> Mapping[str, str]:
        driver = self._wait()
        if driver is None:
            return {r.uid: self._not_ready(r) for r in refs}
        return driver.unprepare(refs)


class RegistrationHooks:
    """The kubelet's registration answers, kept until the plugin is wired to hear them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fn: Callable[[bool, str], None] | None = None
        self._last: tuple[bool, str] | None = None

    def notify(self, ok: bool, error: str) -> None:
        with self._lock:
            self._last = (ok, error)
            fn = self._fn
        if fn is not None:
            fn(ok, error)

    def attach(self, fn: Callable[[bool, str], None]) -> None:
        with self._lock:
            self._fn, last = fn, self._last
        if last is not None:
            fn(*last)


def _refs(request: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, uid=c.uid, name=c.name) for c in request.claims]


def _dra_servicer(msgs: Any, driver: Driver) -> Any:
    class Servicer:
        def NodePrepareResources(self, request: Any, context: Any) -> Any:
            resp = msgs.NodePrepareResourcesResponse()
            for uid, result in driver.prepare(_refs(request)).items():
                entry = resp.claims[uid]
                if result.error:
                    entry.error = result.error
                    continue
                for d in result.devices:
                    entry.devices.add(
                        request_names=d.request_names,
                        pool_name=d.pool,
                        device_name=d.device,
                        cdi_device_ids=d.cdi_device_ids,
                    )
            return resp

        def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
            resp = msgs.NodeUnprepareResourcesResponse()
            for uid, error in driver.unprepare(_refs(request)).items():
                resp.claims[uid].error = error
            return resp

    return Servicer()


class PluginServers:
    def __init__(
        self,
        driver: Driver,
        *,
        driver_name: str,
        kubelet_dir: Path,
        instance: str,
        on_registered: Callable[[bool, str], None],
        workers: int = 16,
    ) -> None:
        self.driver_name = driver_name
        self.registry_dir = kubelet_dir / "plugins_registry"
        self.plugin_dir = kubelet_dir / "plugins" / driver_name
        suffix = f"-{instance}" if instance else ""
        self.reg_socket = self.registry_dir / f"{driver_name}{suffix}-reg.sock"
        self.dra_socket = self.plugin_dir / f"dra{suffix}.sock"
        self._on_registered = on_registered
        self._workers = workers
        self._driver = driver
        # The device health stream (v1alpha1.DRAResourceHealth), served on the DRA socket.
        self.health = HealthFeed()
        self._dra: RpcServer | None = None
        self._reg: RpcServer | None = None
        self._reg_inode = 0
        self._dra_inode = 0
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None

    # -- registration service --------------------------------------------------------------
    def GetInfo(self, request: Any, context: Any) -> Any:
        return kapi.registration.PluginInfo(
            type=kapi.DRA_PLUGIN_TYPE,
            name=self.driver_name,
            endpoint=str(self.dra_socket),
            # The health service last: the kubelet picks the first DRA service it knows
            # (k8s.io/dynamic-resource-allocation/kubeletplugin lists it the same way).
            supported_versions=[kapi.DRA_V1, kapi.DRA_V1BETA1, kapi.DRA_HEALTH_V1ALPHA1],
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        if request.plugin_registered:
            log.info(
                "registered with the kubelet", driver=self.driver_name, socket=str(self.reg_socket)
            )
        else:
            log.error(
                "the kubelet refused the registration", driver=self.driver_name, error=request.error
            )
        self._on_registered(bool(request.plugin_registered), str(request.error))
        return kapi.registration.RegistrationStatusResponse()

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        # Both sockets are bound before the server's code is even imported, the
        # registration socket last: once it exists the kubelet may connect at once, and
        # its connection waits in the backlog until the server accepts it.
        dra = self._bind(self.plugin_dir, self.dra_socket)
        reg = self._bind(self.registry_dir, self.reg_socket)
        self._dra_inode = os.stat(self.dra_socket).st_ino
        self._reg_inode = os.stat(self.reg_socket).st_ino
        self._serve_dra(dra)
        self._serve_registration(reg)
        self._watch = threading.Thread(
            target=self._keep_registration, name="reg-watch", daemon=True
        )
        self._watch.start()

    @staticmethod
    def _bind(directory: Path, path: Path) -> socket.socket:
        directory.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        return bind_unix(path)

    def _start_dra(self) -> None:
        sock = self._bind(self.plugin_dir, self.dra_socket)
        self._dra_inode = os.stat(self.dra_socket).st_ino
        self._serve_dra(sock)

    def _start_registration(self) -> None:
        sock = self._bind(self.registry_dir, self.reg_socket)
        self._reg_inode = os.stat(self.reg_socket).st_ino
        self._serve_registration(sock)

    def _serve_dra(self, sock: socket.socket) -> None:
        from dradriver.kubeletplugin.health_service import HealthServicer
        from dradriver.kubeletplugin.rpc.server import RpcServer, service

        methods = {
            **service(kapi.dra_v1, "DRAPlugin", _dra_servicer(kapi.dra_v1, self._driver)),
            **service(kapi.dra_v1beta1, "DRAPlugin", _dra_servicer(kapi.dra_v1beta1, self._driver)),
            **service(kapi.health_v1alpha1, "DRAResourceHealth", HealthServicer(self.health)),
        }
        self._dra = RpcServer(methods, self._workers, "dra", sock)
        self._dra.start()

    def _serve_registration(self, sock: socket.socket) -> None:
        from dradriver.kubeletplugin.rpc.server import RpcServer, service

        self._reg = RpcServer(service(kapi.registration, "Registration", self), 2, "reg", sock)
        self._reg.start()

    def _socket_alive(self, path: Path, inode: int) -> bool:
        try:
            return os.stat(path).st_ino == inode
        except FileNotFoundError:
            return False

    def _keep_registration(self) -> None:
        while not self._stop.wait(0.5):
            if not self._socket_alive(self.dra_socket, self._dra_inode) and not self._stop.is_set():
                # Someone cleaned the plugin directory: the kubelet's next call would find
                # no socket. A new one at the same path; in-flight calls on the old
                # server finish.
                log.warning("DRA socket gone; recreating it", socket=str(self.dra_socket))
                old = self._dra
                try:
                    self._start_dra()
                except (OSError, RuntimeError) as exc:
                    log.error("recreating the DRA socket failed", error=str(exc))
                # The old server drains meanwhile (it never touches the path): calls
                # in flight get a few seconds, new ones go to the new socket at once.
                if old is not None and old is not self._dra:
                    old.stop(grace=5)
            try:
                alive = os.stat(self.reg_socket).st_ino == self._reg_inode
            except FileNotFoundError:
                alive = False
            if not alive and not self._stop.is_set():
                log.warning("registration socket gone; recreating it", socket=str(self.reg_socket))
                if self._reg is not None:
                    self._reg.stop(grace=None).wait(2)
                self._on_registered(False, "")  # not refused: to be registered anew
                try:
                    self._start_registration()
                except (OSError, RuntimeError) as exc:
                    log.error("recreating the registration socket failed", error=str(exc))

    def stop(self, grace: float = 30.0) -> None:
        """Stop taking calls, let in-flight ones finish, remove our sockets. Once."""
        if self._stop.is_set():
            return
        self._stop.set()
        self.health.stop()  # its streams would otherwise hold the grace period
        if self._reg is not None:
            self._reg.stop(grace=None)
            self.reg_socket.unlink(missing_ok=True)
        if self._dra is not None:
            self._dra.stop(grace=grace).wait(grace)
            self.dra_socket.unlink(missing_ok=True)

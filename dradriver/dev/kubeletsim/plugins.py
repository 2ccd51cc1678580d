"""Plugin discovery and registration, as the kubelet's plugin watcher does it.

The kubelet watches <root>/plugins_registry for sockets, asks each one GetInfo, picks
the first DRA version both sides support, checks the advertised endpoint, and answers
NotifyRegistrationStatus. Several instances of one driver may be registered at once
(rolling updates); calls go to the newest reachable one.
"""

from __future__ import annotations

import os
import re
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from dradriver.api import kubelet as kapi
from dradriver.logs import get_logger

log = get_logger("kubeletsim.plugins")

# What this kubelet speaks, in the kubelet's own order of preference.
SUPPORTED_VERSIONS = (kapi.DRA_V1, kapi.DRA_V1BETA1)
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
RPC_TIMEOUT = 5.0
RETRY_MAX = 30.0


class PluginError(Exception):
    pass


@dataclass
class PluginInstance:
    driver: str
    registration_socket: Path
    endpoint: str
    version: str
    registered_at: float
    channel: grpc.Channel
    reachable: bool = True

    def stub(self) -> Any:
        if self.version == kapi.DRA_V1:
            return kapi.dra_v1_grpc.DRAPluginStub(self.channel)
        return kapi.dra_v1beta1_grpc.DRAPluginStub(self.channel)

    def messages(self) -> Any:
        return kapi.dra_v1 if self.version == kapi.DRA_V1 else kapi.dra_v1beta1


@dataclass
class _Attempt:
    identity: tuple[int, int]
    failures: int = 0
    next_try: float = 0.0
    last_error: str = ""


@dataclass
class PluginRegistry:
    registry_dir: Path
    # Called with (driver) when no instance of it has been reachable for wipe_after seconds.
    on_driver_gone: Callable[[str], None]
    wipe_after: float = 30.0
    # Called with (driver) after a (re-)registration, e.g. to log it.
    on_registered: Callable[[str], None] | None = None
    instances: dict[Path, PluginInstance] = field(default_factory=dict)
    _attempts: dict[Path, _Attempt] = field(default_factory=dict)
    _unreachable_since: dict[str, float] = field(default_factory=dict)
    _wiped: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- discovery -------------------------------------------------------------------------
    def scan(self) -> None:
        """One pass of the watcher: register new or replaced sockets, drop vanished ones."""
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        seen: dict[Path, tuple[int, int]] = {}
        for entry in os.scandir(self.registry_dir):
            if entry.name.startswith("."):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISSOCK(st.st_mode):
                seen[Path(entry.path)] = (st.st_ino, st.st_mtime_ns)
        with self._lock:
            for path in list(self.instances):
                if path not in seen:
                    self._deregister(path, "registration socket removed")
            for path in list(self._attempts):
                if path not in seen:
                    del self._attempts[path]
        now = time.monotonic()
        for path, identity in seen.items():
            attempt = self._attempts.get(path)
            if attempt is None or attempt.identity != identity:
                with self._lock:
                    if path in self.instances:
                        self._deregister(path, "registration socket replaced")
                attempt = self._attempts[path] = _Attempt(identity)
            elif path in self.instances or now < attempt.next_try:
                continue
            try:
                self._register(path)
                attempt.failures = 0
                attempt.next_try = float("inf")
            except PluginError as exc:
                attempt.failures += 1
                attempt.next_try = now + min(RETRY_MAX, 0.5 * 2**attempt.failures)
                if str(exc) != attempt.last_error:
                    log.error(
                        "plugin registration failed",
                        socket=str(path),
                        error=str(exc),
                        retry_in=f"{attempt.next_try - now:.1f}s",
                    )
                attempt.last_error = str(exc)

    def _register(self, path: Path) -> None:
        channel = grpc.insecure_channel(f"unix://{path}")
        try:
            reg = kapi.registration_grpc.RegistrationStub(channel)
            try:
                info = reg.GetInfo(kapi.registration.InfoRequest(), timeout=RPC_TIMEOUT)
            except grpc.RpcError as exc:
                raise PluginError(f"GetInfo on {path} failed: {_rpc_error(exc)}") from None
            problem = self._validate(info)
            version = next((v for v in info.supported_versions if v in SUPPORTED_VERSIONS), "")
            if not problem and not version:
                problem = (
                    f"none of the versions the plugin supports {list(info.supported_versions)}"
                    f" is supported by the kubelet {list(SUPPORTED_VERSIONS)}"
                )
            dra_channel: grpc.Channel | None = None
            if not problem:
                dra_channel, problem = _connect(info.endpoint)
            try:
                reg.NotifyRegistrationStatus(
                    kapi.registration.RegistrationStatus(
                        plugin_registered=not problem, error=problem
                    ),
                    timeout=RPC_TIMEOUT,
                )
            except grpc.RpcError as exc:
                if dra_channel is not None:
                    dra_channel.close()
                raise PluginError(
                    f"NotifyRegistrationStatus on {path} failed: {_rpc_error(exc)}"
                ) from None
            if problem:
                raise PluginError(f"plugin {info.name!r} at {path} rejected: {problem}")
            assert dra_channel is not None
        finally:
            channel.close()
        inst = PluginInstance(
            driver=info.name,
            registration_socket=path,
            endpoint=info.endpoint,
            version=version,
            registered_at=time.monotonic(),
            channel=dra_channel,
        )
        with self._lock:
            self.instances[path] = inst
            self._unreachable_since.pop(inst.driver, None)
            self._wiped.discard(inst.driver)
        log.info(
            "plugin registered",
            driver=inst.driver,
            version=version,
            endpoint=inst.endpoint,
            socket=str(path),
        )
        if self.on_registered:
            self.on_registered(inst.driver)

    @staticmethod
    def _validate(info: Any) -> str:
        if info.type != kapi.DRA_PLUGIN_TYPE:
            return f"plugin type {info.type!r} is not supported, want {kapi.DRA_PLUGIN_TYPE!r}"
        if not info.name or len(info.name) > 63 or not DNS_SUBDOMAIN.match(info.name):
            return f"driver name {info.name!r} is not a DNS subdomain of at most 63 characters"
        if not info.endpoint:
            return "the plugin advertised no endpoint"
        return ""

    def _deregister(self, path: Path, why: str) -> None:
        inst = self.instances.pop(path)
        inst.channel.close()
        log.info("plugin deregistered", driver=inst.driver, socket=str(path), reason=why)
        if not self._driver_instances(inst.driver):
            self._unreachable_since.setdefault(inst.driver, time.monotonic())

    def _driver_instances(self, driver: str) -> list[PluginInstance]:
        return [i for i in self.instances.values() if i.driver == driver]

    # -- reachability ----------------------------------------------------------------------
    def check_reachability(self) -> None:
        """Probes every instance; wipes a driver's slices once none has answered for a while."""
        with self._lock:
            instances = list(self.instances.values())
        for inst in instances:
            if _ready(inst.channel, 0.5):
                inst.reachable = True
            else:
                if inst.reachable:
                    log.warning("plugin unreachable", driver=inst.driver, endpoint=inst.endpoint)
                inst.reachable = False
        now = time.monotonic()
        gone: list[str] = []
        with self._lock:
            drivers = {i.driver for i in self.instances.values()} | set(self._unreachable_since)
            for driver in drivers:
                if any(i.reachable for i in self._driver_instances(driver)):
                    self._unreachable_since.pop(driver, None)
                    continue
                since = self._unreachable_since.setdefault(driver, now)
                if now - since >= self.wipe_after and driver not in self._wiped:
                    self._wiped.add(driver)
                    gone.append(driver)
        for driver in gone:
            log.warning(
                "no plugin instance reachable; deleting the driver's slices",
                driver=driver,
                after=f"{self.wipe_after:.0f}s",
            )
            self.on_driver_gone(driver)

    # -- calls -----------------------------------------------------------------------------
    def client(self, driver: str) -> PluginInstance:
        with self._lock:
            candidates = sorted(
                self._driver_instances(driver), key=lambda i: i.registered_at, reverse=True
            )
        for inst in candidates:
            if inst.reachable:
                return inst
        if candidates:
            return candidates[0]
        raise PluginError(f"DRA driver {driver} is not registered")

    def registered_drivers(self) -> list[str]:
        with self._lock:
            return sorted({i.driver for i in self.instances.values()})

    def close(self) -> None:
        with self._lock:
            for inst in self.instances.values():
                inst.channel.close()
            self.instances.clear()


def _connect(endpoint: str) -> tuple[grpc.Channel | None, str]:
    if not os.path.isabs(endpoint):
        return None, f"endpoint {endpoint!r} is not an absolute path"
    try:
        if not stat.S_ISSOCK(os.stat(endpoint).st_mode):
            return None, f"endpoint {endpoint} is not a socket"
    except OSError as exc:
        return None, f"endpoint {endpoint} does not exist ({exc.strerror})"
    channel = grpc.insecure_channel(f"unix://{endpoint}")
    if not _ready(channel, RPC_TIMEOUT):
        channel.close()
        return None, f"cannot connect to endpoint {endpoint}"
    return channel, ""


def _ready(channel: grpc.Channel, timeout: float) -> bool:
    """Waits for the channel to connect. A future left running after a timeout would keep
    polling the channel from its own thread, and fail once the channel is closed."""
    future = grpc.channel_ready_future(channel)
    try:
        future.result(timeout=timeout)
        return True
    except grpc.FutureTimeoutError:
        future.cancel()
        return False


def _rpc_error(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{code.name if code else 'UNKNOWN'}: {details}"

"""The two gRPC endpoints the kubelet talks to: the registration socket in its plugin
registry and the DRA socket (DRA v1 and v1beta1, and the health stream in v1 and
v1alpha1, on one server), each served by a grpcio asyncio server on one asyncio loop,
on a thread of its own (the rest of the plugin is threads).
Socket names, sockets recreated, hidden binds: docs/design.md, "The gRPC servers".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from dradriver.api import kubelet as kapi
from dradriver.kubeletplugin.grpc_edge import servicers
from dradriver.kubeletplugin.grpc_edge.health_feed import HealthFeed
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.grpc")

# grpc's own default, said aloud: the kubelet's requests are a few hundred bytes a
# claim, and a larger message is refused (RESOURCE_EXHAUSTED) before it is buffered.
MAX_MESSAGE = 4 << 20

# The kubelet waits this long for calls in flight when it replaces a plugin.
STOP_GRACE = 30.0
# At a stop, the registration goes first (the kubelet then sends its calls to the other
# instance, if one runs) and calls are still taken until none has come for DRAIN_QUIET
# seconds, DRAIN_MAX at most: what the kubelet sent before it switched is answered, not
# failed. Calls that still arrive once the server stops are failed unprocessed, as grpc
# does during a shutdown (UNAVAILABLE, or CANCELLED in the moment its GOAWAY is sent).
DRAIN_QUIET = 0.2
DRAIN_MAX = 2.0

SERVER_OPTIONS: tuple[tuple[str, Any], ...] = (
    # Streams one connection may hold open at once. A reset stream frees its slot at
    # once, but never runs its handler (servicers.Work). Once a client has our SETTINGS
    # it queues streams beyond the limit; until then grpc-go (the kubelet's client)
    # allows itself 100 (defaultMaxStreamsClient), so a burst of pods' prepares on a new
    # connection opens up to 100 at once, and grpc core resets those past the limit
    # (ENHANCE_YOUR_CALM, which grpc-go does not retry: the pod's prepare fails). Hence
    # above 100; calls past the worker threads wait in Work's queue either way.
    ("grpc.max_concurrent_streams", 128),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    # The kubelet may turn keepalives on: pings at least a second apart are answered,
    # even between calls. A peer pinging faster is struck, then sent a GOAWAY
    # (ENHANCE_YOUR_CALM) on its third strike, as grpc does by default.
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 1000),
    ("grpc.http2.max_ping_strikes", 2),
    # channelz's per-call and per-socket bookkeeping is on by default and read by
    # nothing here: tens of microseconds a call.
    ("grpc.enable_channelz", 0),
)


def staging_path(path: Path) -> Path:
    """Where a server binds before its socket is renamed to `path`."""
    return path.with_name(f".{path.name}.new")


@dataclass
class _Served:
    server: grpc.aio.Server
    path: Path
    inode: int


def _alive(served: _Served | None) -> bool:
    """Whether `served`'s socket is still the one it bound (not removed, not replaced)."""
    try:
        return served is not None and os.stat(served.path).st_ino == served.inode
    except FileNotFoundError:
        return False


class PluginServers:
    def __init__(
        self,
        preparer: servicers.Preparer,
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
        self._preparer, self._on_registered = preparer, on_registered
        # The device health stream (v1 and v1alpha1 DRAResourceHealth), on the DRA socket.
        self.health = HealthFeed()
        self._work = servicers.Work(workers, "dra-call")
        self._reg_work = servicers.Work(2, "reg-call")
        self.registration = servicers.RegistrationServicer(
            driver_name, str(self.dra_socket), self._notified, work=self._reg_work
        )
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(
            target=self._loop.run_forever, name="grpc-loop", daemon=True
        )
        self._dra: _Served | None = None
        self._reg: _Served | None = None
        self._stop = threading.Event()

    def sockets(self) -> list[Path]:
        """Every path the servers bind, staging names included (for the length check)."""
        return [p for s in (self.reg_socket, self.dra_socket) for p in (s, staging_path(s))]

    def _notified(self, ok: bool, error: str) -> None:
        if ok:
            log.info(
                "registered with the kubelet", driver=self.driver_name, socket=str(self.reg_socket)
            )
        else:
            log.error("the kubelet refused the registration", driver=self.driver_name, error=error)
        self._on_registered(ok, error)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Serves both sockets, the registration socket last: once it exists the kubelet
        may connect at once, and the DRA socket it names must answer."""
        self._loop_thread.start()
        self._dra = self._serve(self.dra_socket)
        self._reg = self._serve(self.reg_socket)
        threading.Thread(target=self._keep_sockets, name="socket-watch", daemon=True).start()

    def _serve(self, path: Path) -> _Served:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = staging_path(path)

        async def start() -> grpc.aio.Server:
            server = grpc.aio.server(options=SERVER_OPTIONS)
            if path == self.dra_socket:
                servicers.serve_dra(server, self._preparer, self._work, feed=self.health)
            else:
                kapi.registration_grpc.add_RegistrationServicer_to_server(self.registration, server)
            try:
                server.add_insecure_port(f"unix:{staging}")
            except RuntimeError as exc:  # grpc says only "Failed to bind"; say where
                raise OSError(f"cannot bind the Unix socket {staging}: {exc}") from exc
            await server.start()
            return server

        server = asyncio.run_coroutine_threadsafe(start(), self._loop).result(30)
        try:
            os.rename(staging, path)
            inode = os.stat(path).st_ino
        except OSError:
            asyncio.run_coroutine_threadsafe(server.stop(None), self._loop).result(10)
            raise
        return _Served(server, path, inode)

    def _stop_served(self, served: _Served, grace: float | None) -> None:
        future = asyncio.run_coroutine_threadsafe(served.server.stop(grace), self._loop)
        with contextlib.suppress(Exception):
            future.result((grace or 0) + 10)

    def _keep_sockets(self) -> None:
        while not self._stop.wait(0.5):
            if not _alive(self._dra) and not self._stop.is_set():
                # Someone cleaned the plugin directory: the kubelet's next call would find
                # no socket. A new server at the same path; in-flight calls on the old
                # one get a few seconds to finish.
                log.warning("DRA socket gone; recreating it", socket=str(self.dra_socket))
                old = self._dra
                try:
                    self._dra = self._serve(self.dra_socket)
                except (OSError, RuntimeError, TimeoutError) as exc:
                    log.error("recreating the DRA socket failed", error=str(exc))
                if old is not None and old is not self._dra:
                    # Not waited for: the watch goes on meanwhile.
                    asyncio.run_coroutine_threadsafe(old.server.stop(5), self._loop)
            if not _alive(self._reg) and not self._stop.is_set():
                log.warning("registration socket gone; recreating it", socket=str(self.reg_socket))
                if self._reg is not None:
                    self._stop_served(self._reg, grace=None)
                    self._reg = None
                self._on_registered(False, "")  # not refused: to be registered anew
                try:
                    self._reg = self._serve(self.reg_socket)
                except (OSError, RuntimeError, TimeoutError) as exc:
                    log.error("recreating the registration socket failed", error=str(exc))

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Stop taking calls (a GOAWAY on every connection), let in-flight ones finish
        within `grace`, remove our sockets. Once."""
        if self._stop.is_set():
            return
        self._stop.set()
        self.health.stop()  # its streams would otherwise hold the grace period
        if not self._loop_thread.is_alive():
            return
        for served, g in ((self._reg, None), (self._dra, grace)):
            if served is self._dra:  # serves on until DRAIN_QUIET passes without a call
                end = time.monotonic() + DRAIN_MAX
                while (now := time.monotonic()) < end and now - self._work.last_call < DRAIN_QUIET:
                    time.sleep(0.02)
            if served is not None:
                self._stop_served(served, g)
                if _alive(served):
                    served.path.unlink(missing_ok=True)
        # The driver's directory under plugins/ goes with the last instance's socket, so
        # an uninstall leaves nothing in the kubelet's directories; another instance's
        # socket (a rolling update) keeps it.
        with contextlib.suppress(OSError):
            self.plugin_dir.rmdir()
        self._work.close()
        self._reg_work.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(5)

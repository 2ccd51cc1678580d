"""The simulator's registration handshake against real gRPC servers on real Unix sockets:
good plugins register, bad ones are refused with a reason, and the watcher keeps going."""

from __future__ import annotations

import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dradriver.api import kubelet as kapi
from dradriver.dev.kubeletsim.plugins import PluginError, PluginRegistry
from tests.support.standin import StandinPlugin


@pytest.fixture
def root() -> Iterator[Path]:
    import shutil

    d = Path(tempfile.mkdtemp(prefix="drk-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def make_plugin(root: Path, driver: str = "gpu.dradriver.io", **kw: object) -> StandinPlugin:
    p = StandinPlugin(None, driver, root / "plugins_registry", root / "plugins", root / "cdi", **kw)  # type: ignore[arg-type]
    p.start()
    return p


def make_registry(
    root: Path, gone: list[str] | None = None, wipe_after: float = 30.0
) -> PluginRegistry:
    return PluginRegistry(
        root / "plugins_registry",
        on_driver_gone=(gone.append if gone is not None else lambda d: None),
        wipe_after=wipe_after,
    )


def test_good_plugin_registers_with_first_supported_version(root: Path) -> None:
    plugin = make_plugin(root, versions=("v9.DRAPlugin", kapi.DRA_V1BETA1, kapi.DRA_V1))
    reg = make_registry(root)
    try:
        reg.scan()
        assert plugin.registrations == [(True, "")]
        inst = reg.client("gpu.dradriver.io")
        # The kubelet walks the plugin's list in order and takes the first it speaks.
        assert inst.version == kapi.DRA_V1BETA1
        assert inst.endpoint == str(plugin.dra_socket)
        reg.scan()  # a second pass does not register again
        assert plugin.registrations == [(True, "")]
    finally:
        reg.close()
        plugin.stop()


def test_wrong_plugin_type_is_refused_with_reason(root: Path) -> None:
    plugin = make_plugin(root, plugin_type="CSIPlugin")
    reg = make_registry(root)
    try:
        reg.scan()
        assert len(plugin.registrations) == 1
        ok, error = plugin.registrations[0]
        assert not ok and "CSIPlugin" in error and "not supported" in error
        with pytest.raises(PluginError, match="not registered"):
            reg.client("gpu.dradriver.io")
    finally:
        reg.close()
        plugin.stop()


def test_no_common_version_is_refused(root: Path) -> None:
    plugin = make_plugin(root, versions=("v1alpha4.DRAPlugin",))
    reg = make_registry(root)
    try:
        reg.scan()
        ok, error = plugin.registrations[0]
        assert not ok and "v1alpha4.DRAPlugin" in error
    finally:
        reg.close()
        plugin.stop()


def test_missing_endpoint_is_refused_with_path(root: Path) -> None:
    plugin = make_plugin(root, endpoint_override=str(root / "nowhere" / "dra.sock"))
    reg = make_registry(root)
    try:
        reg.scan()
        ok, error = plugin.registrations[0]
        assert not ok and "does not exist" in error and "nowhere/dra.sock" in error
    finally:
        reg.close()
        plugin.stop()


def test_garbage_socket_is_reported_and_the_watcher_keeps_serving(root: Path) -> None:
    registry = root / "plugins_registry"
    registry.mkdir(parents=True)
    garbage = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    garbage.bind(str(registry / "junk-reg.sock"))
    garbage.listen(8)
    stop = threading.Event()

    def answer_garbage() -> None:
        garbage.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = garbage.accept()
            except TimeoutError:
                continue
            conn.sendall(b"HTTP/1.1 200 OK\r\n\r\nthis is not gRPC\r\n" * 4)
            conn.close()

    t = threading.Thread(target=answer_garbage, daemon=True)
    t.start()
    reg = make_registry(root)
    plugin = None
    try:
        reg.scan()  # must not raise
        assert reg.registered_drivers() == []
        plugin = make_plugin(root)
        reg.scan()
        assert reg.registered_drivers() == ["gpu.dradriver.io"]
    finally:
        stop.set()
        t.join()
        garbage.close()
        reg.close()
        if plugin:
            plugin.stop()


def test_removed_socket_deregisters_and_driver_is_wiped_after_delay(root: Path) -> None:
    gone: list[str] = []
    plugin = make_plugin(root)
    reg = make_registry(root, gone, wipe_after=0.3)
    try:
        reg.scan()
        reg.check_reachability()
        assert gone == []
        plugin.stop()  # removes both sockets, as a plugin does on shutdown
        reg.scan()
        assert reg.registered_drivers() == []
        reg.check_reachability()
        assert gone == []  # not before the delay
        import time

        time.sleep(0.4)
        reg.check_reachability()
        reg.check_reachability()
        assert gone == ["gpu.dradriver.io"]  # exactly once
    finally:
        reg.close()


def test_replaced_socket_registers_again(root: Path) -> None:
    plugin = make_plugin(root)
    reg = make_registry(root)
    try:
        reg.scan()
        plugin.stop()
        plugin2 = make_plugin(root)
        reg.scan()
        assert plugin2.registrations == [(True, "")]
        assert reg.registered_drivers() == ["gpu.dradriver.io"]
        plugin2.stop()
    finally:
        reg.close()

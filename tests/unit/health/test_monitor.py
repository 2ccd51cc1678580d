"""The NVML edge of health over the fake GPUs (the real pynvml code above the fake C
library): events and probes -> the book, the plugin's NodeHealth (taints, a lost GPU kept
published, state across a restart) and the kubelet's health stream."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dradriver.api import kubelet as kapi
from dradriver.health.model import Health, Policy, Transition
from dradriver.health.monitor import HealthMonitor, probe_gpu
from dradriver.inventory.node_devices import MigMode
from dradriver.kubeletplugin.device_view.health import HealthOptions, NodeEvents, NodeHealth
from dradriver.kubeletplugin.grpc_edge.health_feed import HealthFeed
from dradriver.nvml.library import Nvml, open_nvml
from dradriver.slices.build import build
from dradriver.slices.taints import TaintEffect
from tests.support.gpu_names import names_of, real

DRIVER = "gpu.dradriver.io"


def wait_until(cond: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    ev = threading.Event()
    yield ev
    ev.set()


def backend(tmp: Path, spec: str) -> Nvml:
    nvml = open_nvml(f"fake:{spec}", node="n", state_dir=tmp)
    nvml.init()
    return nvml


def node_health(tmp: Path, nvml: Nvml, probes: int = 2, period: float = 60) -> NodeHealth:
    return NodeHealth(
        nvml.module,
        driver=DRIVER,
        state_dir=tmp,
        options=HealthOptions(Policy(recovery_probes=probes), TaintEffect.NO_SCHEDULE, period),
        events=NodeEvents(None, "n"),
        clock=lambda: 1_700_000_000,
    )


def test_probe_finds_lost_and_pending_remap(tmp_path: Path) -> None:
    nvml = backend(tmp_path, "2xA100-80GB")
    fake, m = nvml.backend, nvml.module
    u0, u1 = (g.uuid for g in fake.machine.gpus)
    assert probe_gpu(m, u0).problem == "" and probe_gpu(m, u0).unknown == ""
    fake.faults.lose_gpu(0)
    fake.faults.xid_error(1, 94)
    assert probe_gpu(m, u0).problem == "lost"
    assert probe_gpu(m, u1).problem == "row-remap-pending"
    fake.faults.fail_nth("nvmlDeviceGetHandleByUUID", 1, m.NVML_ERROR_UNKNOWN)
    fake.machine.reset_gpu(0)
    assert probe_gpu(m, u0).unknown.startswith("NVMLError_Unknown")
    assert probe_gpu(m, u0) == probe_gpu(m, u0).__class__(u0)


def test_events_reach_the_book_and_skip_list_xids_do_not(
    tmp_path: Path, stop: threading.Event
) -> None:
    nvml = backend(tmp_path, "2xH100-80GB")
    fake = nvml.backend
    uuids = [(g.index, g.uuid) for g in fake.machine.gpus]
    seen: list[Transition] = []
    from dradriver.health.model import HealthBook

    mon = HealthMonitor(
        nvml.module, HealthBook(), lambda: uuids, on_change=seen.append, probe_period=60
    )
    threading.Thread(target=mon.run_events, args=(stop,), daemon=True).start()
    wait_until(mon.events_watched.is_set, "the event set")
    fake.faults.xid_error(1, 13)  # an application's fault
    fake.faults.xid_error(0, 48)  # a double-bit ECC error: XID 48 and the ECC event
    wait_until(lambda: len(seen) == 1, "the XID 48 transition")
    time.sleep(0.2)
    assert len(seen) == 1  # the DBE event after it changed nothing: first reason kept
    (t,) = seen
    assert t.uuid == uuids[0][1] and t.after.fault is not None
    assert t.after.fault.reason == "xid-48" and t.after.fault.xid == 48
    assert mon.snapshot().keys() == {uuids[0][1]}


def test_an_xid_on_a_gpu_instance(tmp_path: Path, stop: threading.Event) -> None:
    from dradriver.health.model import HealthBook, Instance

    nvml = backend(tmp_path, "1xH100-80GB:mig=on")
    fake, m = nvml.backend, nvml.module
    gi = fake.machine.create_gpu_instance(0, 9, 4)  # 3g.40gb at 4
    uuids = [(0, fake.machine.gpus[0].uuid)]
    seen: list[Transition] = []
    mon = HealthMonitor(m, HealthBook(), lambda: uuids, on_change=seen.append, probe_period=60)
    threading.Thread(target=mon.run_events, args=(stop,), daemon=True).start()
    wait_until(mon.events_watched.is_set, "the event set")
    fake.faults.xid_error(0, 94, gpu_instance_id=gi.id)
    wait_until(lambda: bool(seen), "the transition")
    assert seen[0].after.fault is None
    assert seen[0].after.instances[0][0] == Instance(9, 4)


def test_node_health_taints_keeps_a_lost_gpu_and_recovers(
    tmp_path: Path, stop: threading.Event
) -> None:
    nvml = backend(tmp_path, "2xH100-80GB")
    fake = nvml.backend
    gpus = names_of(nvml.discover().inventory)  # by NVML index
    health = node_health(tmp_path, nvml)
    changes: list[int] = []
    health.listeners.append(lambda: changes.append(1))

    gpu0: list[dict[str, object]] = []  # GPU 0's devices as published
    fingerprints: list[str] = []

    def publish() -> dict[str, list[object]]:
        inv = health.inventory(nvml.discover().inventory)
        built = build(inv, MigMode.DYNAMIC)
        slices = health.taint(built.slices, built.offer.devices().values())
        devices[:] = list(built.offer.devices().values())
        fingerprints[:] = [s.fingerprint() for s in slices]
        gpu0[:] = [
            d
            for s in slices
            for d in s.devices
            if d["name"] == gpus[0] or d["name"].startswith(f"{gpus[0]}-")
        ]
        return {d["name"]: d.get("taints", []) for s in slices for d in s.devices}

    devices: list[object] = []
    first = publish()
    assert not any(first.values()) and len(first) == 52
    gpu0_before = list(gpu0)
    health.start(stop, lambda: devices)  # type: ignore[arg-type,return-value]
    wait_until(health.monitor.events_watched.is_set, "the event set")
    wait_until(lambda: health.monitor.probe_rounds > 0, "the first probe")
    fake.faults.xid_error(1, 79)  # off the bus
    wait_until(lambda: bool(changes), "the change")
    after = publish()
    tainted = {n for n, t in after.items() if t}
    assert tainted == {n for n in after if n == gpus[1] or n.startswith(f"{gpus[1]}-")}
    assert len(after) == 52  # the lost GPU is still published, from its last description
    # GPU 0's devices are untouched: its NVLink domain still names GPU 1 (still wired).
    assert gpu0 == gpu0_before
    assert after[gpus[1]] == [
        {
            "key": f"{DRIVER}/unhealthy",
            "value": "xid-79",
            "effect": "NoSchedule",
            "timeAdded": "2023-11-14T22:13:20Z",
        }
    ]
    assert health.health_reports()[real("gpu-1-mig-1g10gb-3", gpus)][0] == "Unhealthy"
    assert health.health_reports()[gpus[0]] == ("Healthy", "")

    # A restart: the XID is not seen again and NVML cannot describe GPU 1, yet it stays
    # published and tainted.
    stop.set()
    time.sleep(0.2)
    nvml2 = backend(tmp_path, "2xH100-80GB")
    health = node_health(tmp_path, nvml2)
    assert nvml2.backend.machine.gpus[1].lost
    inv = health.inventory(nvml2.discover().inventory)
    assert [g.index for g in inv.gpus] == [0, 1]
    built = build(inv, MigMode.DYNAMIC)
    again = health.taint(built.slices, built.offer.devices().values())
    assert {d["name"] for s in again for d in s.devices if d.get("taints")} == tainted
    # Nothing to write after the restart: the slices are what was published before it.
    assert [s.fingerprint() for s in again] == fingerprints

    # Reset: the GPU recovers after two clean probes.
    nvml2.backend.machine.reset_gpu(1)
    health.monitor.probe_once()
    assert health.monitor.snapshot()  # one clean probe is not enough
    health.monitor.probe_once()
    assert health.monitor.snapshot() == {}
    assert '"gpus": {}' in (tmp_path / "health.json").read_text()


def test_damaged_health_state_is_not_fatal(tmp_path: Path) -> None:
    (tmp_path / "health.json").write_text("{not json")
    nvml = backend(tmp_path, "1xL4")
    assert node_health(tmp_path, nvml).book.gpus == {}
    (tmp_path / "health.json").write_text('{"format": 99}')
    assert node_health(tmp_path, nvml).book.gpus == {}


def test_health_stream_sends_full_state_then_each_change() -> None:
    feed = HealthFeed(resend=0.2)
    state = {"gpu-0": ("Healthy", ""), "gpu-1": ("Healthy", "")}
    got: list[dict[str, str]] = []

    async def read() -> None:
        async for msg in feed.stream(kapi.health_v1alpha1):
            got.append(
                {d.device.device_name: type(d).DESCRIPTOR.fields_by_name["health"]
                 .enum_type.values_by_number[d.health].name for d in msg.devices}
            )  # fmt: skip
            assert all(d.device.pool_name == "node-a" for d in msg.devices)

    t = threading.Thread(target=asyncio.run, args=(read(),), daemon=True)
    t.start()
    wait_until(lambda: feed.streams == 1, "the stream open")
    time.sleep(0.1)
    assert got == []  # nothing before the plugin knows its devices
    feed.attach("node-a", lambda: dict(state))
    wait_until(lambda: len(got) == 1, "the full state")
    assert got[0] == {"gpu-0": "HEALTHY", "gpu-1": "HEALTHY"}
    state["gpu-1"] = (str(Health.UNHEALTHY), "")
    feed.changed()
    wait_until(lambda: len(got) >= 2, "the change")
    assert got[1] == {"gpu-0": "HEALTHY", "gpu-1": "UNHEALTHY"}
    wait_until(lambda: len(got) >= 3, "the periodic resend", timeout=2)  # kubelet: 30 s
    feed.stop()
    t.join(2)
    assert not t.is_alive() and feed.streams == 0


def test_the_dra_socket_serves_the_health_stream_and_registration_names_it() -> None:
    """What the kubelet does: GetInfo, then NodeWatchResources on the DRA socket."""
    import tempfile

    import grpc

    from dradriver.kubeletplugin.grpc_edge.server import PluginServers
    from dradriver.kubeletplugin.grpc_edge.servicers import LatePreparer

    root = Path(tempfile.mkdtemp(prefix="drh-"))  # a Unix socket path stays short
    servers = PluginServers(
        LatePreparer(patience=0.1),
        driver_name=DRIVER,
        kubelet_dir=root,
        instance="t",
        on_registered=lambda ok, error: None,
    )
    servers.start()
    try:
        with grpc.insecure_channel(f"unix://{servers.reg_socket}") as ch:
            stub = kapi.registration_grpc.RegistrationStub(ch)
            info = stub.GetInfo(kapi.registration.InfoRequest(), timeout=5)
        assert list(info.supported_versions) == [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        ]
        state = {"gpu-0": ("Healthy", ""), "gpu-1": ("Unhealthy", "")}
        servers.health.attach("node-a", lambda: dict(state))
        with grpc.insecure_channel(f"unix://{servers.dra_socket}") as ch:
            stub = kapi.health_v1alpha1_grpc.DRAResourceHealthStub(ch)
            stream = stub.NodeWatchResources(
                kapi.health_v1alpha1.NodeWatchResourcesRequest(), timeout=10
            )
            first = next(stream)
            got = {d.device.device_name: d.health for d in first.devices}
            h = kapi.health_v1alpha1.HealthStatus
            assert got == {"gpu-0": h.Value("HEALTHY"), "gpu-1": h.Value("UNHEALTHY")}
            assert {d.device.pool_name for d in first.devices} == {"node-a"}
            assert all(d.last_updated_time > 1_700_000_000 for d in first.devices)
            state["gpu-1"] = ("Healthy", "")
            servers.health.changed()
            second = next(stream)
            assert {d.health for d in second.devices} == {h.Value("HEALTHY")}
            stream.cancel()
        wait_until(lambda: servers.health.streams == 0, "the cancelled stream ended")
    finally:
        t0 = time.monotonic()
        servers.stop(grace=5)
        assert time.monotonic() - t0 < 3  # open streams end at stop, not after the grace
        import shutil

        shutil.rmtree(root, ignore_errors=True)

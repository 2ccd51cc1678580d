"""What the plugin tells the kubelet of each device's health (the health streams'
message): the fault, led by the taint's value, with what an XID means; why a GPU's
health is unknown; nothing for a healthy device. Over the fake GPUs, observations fed
to the plugin's monitor as its threads would."""

from __future__ import annotations

import threading
from pathlib import Path

from dradriver.api import kubelet as kapi
from dradriver.health.model import (
    DeviceHealth,
    Fault,
    Health,
    Instance,
    Policy,
    Probe,
    XidEvent,
)
from dradriver.inventory.node_devices import MigMode
from dradriver.kubeletplugin.device_view.health import (
    HealthOptions,
    NodeEvents,
    NodeHealth,
    fault_message,
    health_message,
)
from dradriver.kubeletplugin.grpc_edge.health_feed import HealthFeed
from dradriver.nvml.library import open_nvml
from dradriver.slices.build import build
from dradriver.slices.taints import TaintEffect

NOW = 1_700_000_000  # 2023-11-14T22:13:20Z


def test_fault_messages() -> None:
    assert fault_message(Fault("xid-79", NOW, 79)) == (
        "xid-79 (NVIDIA XID 79: GPU has fallen off the bus), since 2023-11-14T22:13:20Z"
    )
    assert fault_message(Fault("xid-999", NOW, 999)) == (
        "xid-999 (NVIDIA XID 999), since 2023-11-14T22:13:20Z"
    )
    assert fault_message(Fault("lost", NOW)) == (
        "lost (NVML cannot reach the GPU), since 2023-11-14T22:13:20Z"
    )
    assert fault_message(Fault("something-new", NOW)) == (
        "something-new, since 2023-11-14T22:13:20Z"
    )
    assert health_message(DeviceHealth(Health.HEALTHY), "") == ""
    assert health_message(DeviceHealth(Health.UNKNOWN), "NVMLError_Unknown") == (
        "the last probe could not tell: NVMLError_Unknown"
    )


def test_reports_by_device_fault_unknown_and_healthy(tmp_path: Path) -> None:
    nvml = open_nvml("fake:3xH100-80GB:mig=on", node="n", state_dir=tmp_path)
    nvml.init()
    inv = nvml.discover().inventory
    devices = list(build(inv, MigMode.DYNAMIC).offer.devices().values())
    health = NodeHealth(
        nvml.module,
        driver="gpu.dradriver.io",
        state_dir=tmp_path,
        options=HealthOptions(Policy(), TaintEffect.NO_SCHEDULE, 60),
        events=NodeEvents(None, "n"),
        clock=lambda: NOW,
    )
    stopped = threading.Event()
    stopped.set()  # the monitor's threads return at once: the test observes for them
    health.start(stopped, lambda: devices)
    u0, u1, u2 = (g.uuid for g in sorted(inv.gpus, key=lambda g: g.index))
    health.monitor.observe(XidEvent(u0, 79))
    health.monitor.observe(Probe(u1, unknown="NVMLError_Unknown: Unknown Error"))
    inst = next(d for d in devices if d.gpu.uuid == u2 and d.profile is not None)
    profile, start = inst.profile, inst.placement_start
    assert profile is not None and start is not None
    health.monitor.observe(XidEvent(u2, 94, Instance(profile.profile_id, start)))

    reports = health.health_reports()
    assert reports.keys() == {d.name for d in devices}
    xid79 = "xid-79 (NVIDIA XID 79: GPU has fallen off the bus), since 2023-11-14T22:13:20Z"
    unknown = "the last probe could not tell: NVMLError_Unknown: Unknown Error"
    for d in devices:
        if d.gpu.uuid == u0:  # the whole GPU and every MIG device on it
            assert reports[d.name] == ("Unhealthy", xid79), d.name
        elif d.gpu.uuid == u1:
            assert reports[d.name] == ("Unknown", unknown), d.name
    assert reports[inst.name] == (
        "Unhealthy",
        "xid-94 (NVIDIA XID 94: contained ECC error), since 2023-11-14T22:13:20Z",
    )
    whole2 = next(d for d in devices if d.gpu.uuid == u2 and d.profile is None)
    assert reports[whole2.name] == ("Healthy", "")

    # As the streams send it.
    feed = HealthFeed()
    feed.attach("node-a", health.health_reports)
    sent = {d.device.device_name: d for d in feed.message(kapi.health_v1).devices}
    assert sent[inst.name].message.startswith("xid-94 ")
    assert sent[whole2.name].message == "" and sent[whole2.name].health == kapi.health_v1.HEALTHY
    assert {d.health_check_timeout_seconds for d in sent.values()} == {30}

"""The fake's health faults as the driver sees them through pynvml: what an XID leaves
behind, row remapping, faults surviving a restart of the owning process, and injection
from another process through the state directory (`dradriver dev inject`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fakenvml import inject, load, open_backend
from tests.support.fakes import Start


def test_xid_79_takes_the_gpu_off_the_bus(start: Start) -> None:
    fake = start("2xH100-80GB")
    nvml = fake.pynvml
    events = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(
        nvml.nvmlDeviceGetHandleByIndex(1), nvml.nvmlEventTypeXidCriticalError, events
    )
    fake.faults.xid_error(1, 79)
    assert nvml.nvmlEventSetWait(events, 100).eventData == 79
    with pytest.raises(nvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetHandleByUUID(fake.machine.gpus[1].uuid)
    nvml.nvmlDeviceGetHandleByIndex(0)


def test_xid_48_is_a_dbe_with_a_row_remap_pending_until_reset(start: Start) -> None:
    fake = start("1xA100-80GB")
    nvml = fake.pynvml
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    events = nvml.nvmlEventSetCreate()
    mask = nvml.nvmlEventTypeXidCriticalError | nvml.nvmlEventTypeDoubleBitEccError
    nvml.nvmlDeviceRegisterEvents(h, mask, events)
    assert nvml.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)
    fake.faults.xid_error(0, 48)
    first, second = nvml.nvmlEventSetWait(events, 100), nvml.nvmlEventSetWait(events, 100)
    assert (first.eventType, first.eventData) == (nvml.nvmlEventTypeXidCriticalError, 48)
    assert second.eventType == nvml.nvmlEventTypeDoubleBitEccError
    assert nvml.nvmlDeviceGetRemappedRows(h) == (0, 1, 1, 0)
    fake.machine.reset_gpu(0)
    assert nvml.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)


def test_no_row_remapping_on_gddr_cards(start: Start) -> None:
    fake = start("1xL4")
    nvml = fake.pynvml
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetRemappedRows(nvml.nvmlDeviceGetHandleByIndex(0))
    fake.faults.xid_error(0, 94)  # the event only
    assert not fake.machine.gpus[0].remap_pending


def test_a_lost_gpu_stays_lost_across_a_restart(tmp_path: Path) -> None:
    fake = load("2xL4", node="n", state_dir=tmp_path)
    fake.faults.lose_gpu(1)
    again = load("2xL4", node="n", state_dir=tmp_path)
    assert again.machine.gpus[1].lost and not again.machine.gpus[0].lost
    again.machine.reset_gpu(1)
    assert not load("2xL4", node="n", state_dir=tmp_path).machine.gpus[1].lost


def test_inject_from_another_process_reaches_the_owner(tmp_path: Path) -> None:
    nvml = open_backend("2xH100-80GB", "node-x", tmp_path, owner=True)
    fake = nvml.backend
    nvml.init()
    events = nvml.module.nvmlEventSetCreate()
    nvml.module.nvmlDeviceRegisterEvents(
        nvml.module.nvmlDeviceGetHandleByIndex(0),
        nvml.module.nvmlEventTypeXidCriticalError,
        events,
    )

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "dradriver.cli",
                "dev",
                "inject",
                "--state-dir",
                str(tmp_path),
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )

    r = cli("--gpu", "0", "--xid", "79")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("dev inject: node node-x: XID 79 raised on GPU 0 (GPU-")
    assert nvml.module.nvmlEventSetWait(events, 1000).eventData == 79
    assert fake.machine.gpus[0].lost
    r = cli("--gpu", "0", "--recover")
    assert r.returncode == 0 and "reset" in r.stdout
    assert not fake.machine.gpus[0].lost
    r = cli("--gpu", "9", "--lost")
    assert r.returncode == 1 and "no GPU 9: this node has GPUs 0..1" in r.stderr
    r = cli("--lost")
    assert r.returncode == 2 and "--gpu INDEX" in r.stderr
    # A driver upgrade: NVML reports the new version at once, and after a restart.
    r = cli("--driver-version", "580.95.05")
    assert r.returncode == 0 and "570.86.15 replaced by 580.95.05" in r.stdout, r.stderr
    assert nvml.module.nvmlSystemGetDriverVersion() == "580.95.05"
    assert load("2xH100-80GB", node="node-x", state_dir=tmp_path).machine.driver_version == (
        "580.95.05"
    )
    assert list(inject.requests_dir(tmp_path, "node-x").iterdir()) == []


def test_inject_without_a_running_owner_says_so(tmp_path: Path) -> None:
    load("1xL4", node="lonely", state_dir=tmp_path)  # state, but no plugin running
    with pytest.raises(inject.InjectError, match="is the kubelet plugin running"):
        inject.send(tmp_path, "lonely", inject.Request(0, "lost"), timeout=0.3)
    assert not load("1xL4", node="lonely", state_dir=tmp_path).machine.gpus[0].lost
    assert inject.nodes_in(tmp_path) == ["lonely"]


def test_bad_requests_are_answered_not_applied(tmp_path: Path) -> None:
    fake = load("1xL4", node="n", state_dir=tmp_path)
    d = inject.requests_dir(tmp_path, "n")
    d.mkdir()
    (d / "1.json").write_text('{"format": 9}')
    (d / "2.json").write_text("not json")
    assert inject.Watcher(fake.machine, d).poll(fake.machine) == 2
    assert "unknown request format" in (d / "1.done").read_text()
    assert '"ok": false' in (d / "2.done").read_text()


def test_destroying_a_mig_device_of_a_gpu_off_the_bus_counts_as_done(start: Start) -> None:
    """Unprepare must not wait for a GPU that fell off the bus: its instances go with the
    reset that brings it back."""
    from dradriver.nvml.mig import MigCarver

    fake = start("1xH100-80GB:mig=on")
    carver = MigCarver(fake.pynvml)
    uuid = fake.machine.gpus[0].uuid
    made = carver.create(uuid, 9, 0, size=4, compute_slices=3)
    fake.faults.lose_gpu(0)
    carver.destroy(uuid, made.gpu_instance_id, made.compute_instance_id)  # no error
    fake.machine.reset_gpu(0)
    assert fake.machine.gpus[0].gpu_instances == {}

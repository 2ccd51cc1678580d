"""Injected failures, seen through the pynvml API the way the driver would see them."""

from __future__ import annotations

import threading

import pytest

from fakenvml import InitFailure, load
from tests.support.fakes import Start


def test_fail_the_nth_call(start: Start) -> None:
    fake = start("2xL4")
    nvml = fake.pynvml
    fake.faults.fail_nth("nvmlDeviceGetHandleByIndex_v2", 2, nvml.NVML_ERROR_UNKNOWN)
    nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nvml.NVMLError_Unknown):
        nvml.nvmlDeviceGetHandleByIndex(1)
    nvml.nvmlDeviceGetHandleByIndex(1)


def test_failed_calls_change_nothing(start: Start) -> None:
    fake = start("1xH100-80GB:mig=on")
    nvml = fake.pynvml
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    fake.faults.fail_nth("nvmlDeviceCreateGpuInstance", 1, nvml.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(nvml.NVMLError_NoPermission):
        nvml.nvmlDeviceCreateGpuInstance(h, 0)
    assert fake.machine.gpus[0].gpu_instances == {}
    nvml.nvmlDeviceCreateGpuInstance(h, 0)


def test_fail_nth_rejects_nonsense(start: Start) -> None:
    fake = start("1xL4")
    with pytest.raises(ValueError):
        fake.faults.fail_nth("GetName", 1, 999)
    with pytest.raises(ValueError):
        fake.faults.fail_nth("nvmlDeviceGetName", 0, 999)


def test_a_lost_gpu(start: Start) -> None:
    fake = start("3xA100-40GB")
    nvml = fake.pynvml
    h1 = nvml.nvmlDeviceGetHandleByIndex(1)
    events = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(h1, nvml.nvmlEventTypeXidCriticalError, events)
    fake.faults.lose_gpu(1)
    assert nvml.nvmlDeviceGetCount() == 3
    with pytest.raises(nvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetHandleByIndex(1)
    for call in (nvml.nvmlDeviceGetName, nvml.nvmlDeviceGetUUID, nvml.nvmlDeviceGetMemoryInfo):
        with pytest.raises(nvml.NVMLError_GpuIsLost):
            call(h1)
    assert nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(2)) == "NVIDIA A100-SXM4-40GB"
    data = nvml.nvmlEventSetWait(events, 0)
    assert data.eventData == 79
    fake.machine.reset_gpu(1)
    assert nvml.nvmlDeviceGetName(h1) == "NVIDIA A100-SXM4-40GB"


def test_xid_is_delivered_to_a_waiting_thread(start: Start) -> None:
    fake = start("2xH100-80GB:mig=on")
    nvml = fake.pynvml
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    events = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, events)
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(nvml.nvmlEventSetWait(events, 5000)))
    waiter.start()
    fake.faults.raise_xid(1, 48, gpu_instance_id=1, compute_instance_id=0)
    waiter.join(5)
    assert not waiter.is_alive() and len(got) == 1
    data = got[0]
    assert data.eventType == nvml.nvmlEventTypeXidCriticalError
    assert data.eventData == 48
    assert (data.gpuInstanceId, data.computeInstanceId) == (1, 0)
    assert nvml.nvmlDeviceGetUUID(data.device) == nvml.nvmlDeviceGetUUID(h)
    with pytest.raises(nvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait(events, 20)
    nvml.nvmlEventSetFree(events)


def test_events_reach_only_registered_sets(start: Start) -> None:
    fake = start("2xL4")
    nvml = fake.pynvml
    events = nvml.nvmlEventSetCreate()
    fake.faults.raise_xid(0, 13)  # before registration: lost, as on hardware
    nvml.nvmlDeviceRegisterEvents(
        nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlEventTypeXidCriticalError, events
    )
    fake.faults.raise_xid(1, 31)  # another GPU
    with pytest.raises(nvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait(events, 10)
    fake.faults.raise_xid(0, 94)
    data = nvml.nvmlEventSetWait(events, 10)
    assert data.eventData == 94 and data.gpuInstanceId == 0xFFFFFFFF


@pytest.mark.parametrize(
    ("failure", "error"),
    [
        (InitFailure.LIBRARY_NOT_FOUND, "NVMLError_LibraryNotFound"),
        (InitFailure.DRIVER_NOT_LOADED, "NVMLError_DriverNotLoaded"),
        (InitFailure.LIB_RM_VERSION_MISMATCH, "NVMLError_LibRmVersionMismatch"),
        (InitFailure.NO_PERMISSION, "NVMLError_NoPermission"),
    ],
)
def test_init_failures(failure: InitFailure, error: str) -> None:
    fake = load("1xL4", node="n", state_dir=None)
    nvml = fake.pynvml
    fake.faults.fail_init(failure)
    with pytest.raises(getattr(nvml, error)) as info:
        nvml.nvmlInit()
    assert isinstance(info.value, nvml.NVMLError)
    if failure is InitFailure.LIBRARY_NOT_FOUND:
        assert nvml.nvmlLib is None  # pynvml's own dlopen path failed
    fake.faults.fail_init(None)
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 1
    nvml.nvmlShutdown()


def test_library_not_found_after_an_earlier_load(start: Start) -> None:
    fake = start("1xL4")
    nvml = fake.pynvml
    nvml.nvmlShutdown()
    fake.faults.fail_init(InitFailure.LIBRARY_NOT_FOUND)
    with pytest.raises(nvml.NVMLError_LibraryNotFound):
        nvml.nvmlInit()

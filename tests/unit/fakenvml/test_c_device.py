"""Discovery through the real pynvml API of a private module copy, against the fake C
library: what comes back must be the product facts."""

from __future__ import annotations

import ctypes

import pynvml as global_pynvml
import pytest

from fakenvml import load, products
from tests.support.fakes import Start

MIB = 1024 * 1024


@pytest.mark.parametrize("product", list(products.PRODUCTS.values()), ids=lambda p: p.key)
def test_device_queries_report_the_product_facts(start: Start, product: products.Product) -> None:
    nvml = start(f"2x{product.key}").pynvml
    assert nvml.nvmlDeviceGetCount() == 2
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetName(h) == product.name
    assert nvml.nvmlDeviceGetMemoryInfo(h).total == product.memory_mib * MIB
    assert nvml.nvmlDeviceGetCudaComputeCapability(h) == product.compute_capability
    assert nvml.nvmlDeviceGetArchitecture(h) == product.architecture
    assert nvml.nvmlDeviceGetBrand(h) == nvml.NVML_BRAND_NVIDIA
    assert nvml.nvmlDeviceGetIndex(h) == 1
    assert nvml.nvmlDeviceGetMinorNumber(h) == 1
    pci = nvml.nvmlDeviceGetPciInfo(h)
    assert pci.pciDeviceId == product.pci_device_id
    assert pci.busId == "00000000:2A:00.0"
    assert pci.busIdLegacy == "0000:2A:00.0"
    if product.mig_capable:
        assert nvml.nvmlDeviceGetMigMode(h) == [0, 0]
    else:
        with pytest.raises(nvml.NVMLError_NotSupported):
            nvml.nvmlDeviceGetMigMode(h)
    # Zero, not an error, without MIG.
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(h) == 0


def test_named_products() -> None:
    names = {p.key: p.name for p in products.PRODUCTS.values()}
    assert names == {
        "A100-40GB": "NVIDIA A100-SXM4-40GB",
        "A100-80GB": "NVIDIA A100-SXM4-80GB",
        "A30": "NVIDIA A30",
        "H100-80GB": "NVIDIA H100 80GB HBM3",
        "H100-NVL": "NVIDIA H100 NVL",
        "GH200-96GB": "NVIDIA GH200 480GB",
        "GH200-144GB": "NVIDIA GH200 144G HBM3e",
        "H200-141GB": "NVIDIA H200",
        "H200-NVL": "NVIDIA H200 NVL",
        "H20": "NVIDIA H20",
        "B200": "NVIDIA B200",
        "GB200": "NVIDIA GB200",
        "B300": "NVIDIA B300 SXM6 AC",
        "RTX-PRO-6000": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "L40S": "NVIDIA L40S",
        "A10": "NVIDIA A10",
        "L4": "NVIDIA L4",
        "T4": "Tesla T4",
    }
    assert products.L4.memory_mib == 23034 and products.L4.compute_capability == (8, 9)
    assert products.T4.memory_mib == 15360 and products.T4.architecture == 6


def test_system_versions(start: Start) -> None:
    nvml = start("1xT4").pynvml
    assert nvml.nvmlSystemGetDriverVersion() == "570.86.15"
    assert nvml.nvmlSystemGetCudaDriverVersion() == 12080
    assert nvml.nvmlSystemGetCudaDriverVersion_v2() == 12080


def test_driver_version_is_configurable(tmp_path) -> None:
    fake = load("1xT4", node="n", state_dir=None, driver_version="535.104.05")
    fake.pynvml.nvmlInit()
    assert fake.pynvml.nvmlSystemGetDriverVersion() == "535.104.05"


def test_identities_are_deterministic_and_distinct(start: Start, tmp_path) -> None:
    a = start("8xH100-80GB", node="node-a", state_dir=None).pynvml
    b = start("8xH100-80GB", node="node-a", state_dir=None).pynvml
    c = start("8xH100-80GB", node="node-b", state_dir=None).pynvml

    def ids(nvml):
        hs = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
        return [(nvml.nvmlDeviceGetUUID(h), nvml.nvmlDeviceGetPciInfo(h).busId) for h in hs]

    assert ids(a) == ids(b)
    uuids = [u for u, _ in ids(a)]
    assert len(set(uuids)) == 8 and len({bus for _, bus in ids(a)}) == 8
    assert not set(uuids) & {u for u, _ in ids(c)}
    for u in uuids:
        assert u.startswith("GPU-") and [len(x) for x in u[4:].split("-")] == [8, 4, 4, 4, 12]
    numa = [a.nvmlDeviceGetNumaNodeId(a.nvmlDeviceGetHandleByIndex(i)) for i in range(8)]
    assert numa == [0, 0, 0, 0, 1, 1, 1, 1]


def test_handle_by_uuid_and_bus_id(start: Start) -> None:
    nvml = start("2xA100-40GB").pynvml
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    uuid = nvml.nvmlDeviceGetUUID(h)
    assert nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByUUID(uuid)) == 1
    assert nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByPciBusId("0000:2a:00.0")) == 1
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(2)


def test_errors_are_the_module_copys_classes(start: Start) -> None:
    a = start("1xL4").pynvml
    b = start("1xL4").pynvml
    assert a is not b and a.NVMLError_NotSupported is not b.NVMLError_NotSupported
    with pytest.raises(a.NVMLError_NotSupported) as info:
        a.nvmlDeviceGetMigMode(a.nvmlDeviceGetHandleByIndex(0))
    err = info.value
    assert isinstance(err, a.NVMLError)
    assert not isinstance(err, b.NVMLError) and not isinstance(err, global_pynvml.NVMLError)
    assert err.value == a.NVML_ERROR_NOT_SUPPORTED
    assert str(err) == "Not Supported"


def test_error_string_comes_from_the_library(start: Start) -> None:
    nvml = start("1xL4").pynvml
    # pynvml asks the C library for texts its own table lacks.
    assert str(nvml.NVMLError(nvml.NVML_ERROR_INSUFFICIENT_RESOURCES)) == "Insufficient resources"
    assert nvml.nvmlErrorString(nvml.NVML_ERROR_IN_USE) == "In use by another client"


def test_functions_the_fake_lacks_are_function_not_found(start: Start, caplog) -> None:
    nvml = start("1xL4").pynvml
    with pytest.raises(nvml.NVMLError_FunctionNotFound):
        nvml.nvmlDeviceGetPowerUsage(nvml.nvmlDeviceGetHandleByIndex(0))
    assert caplog.records == []


def test_calls_need_init_and_shutdown_is_counted(tmp_path) -> None:
    fake = load("1xL4", node="n", state_dir=None)
    nvml = fake.pynvml
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    nvml.nvmlInit()
    nvml.nvmlInit()
    nvml.nvmlShutdown()
    assert nvml.nvmlDeviceGetCount() == 1
    nvml.nvmlShutdown()
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlShutdown()


def test_compute_mode_is_recorded(start: Start) -> None:
    nvml = start("2xL4").pynvml
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetComputeMode(h) == nvml.NVML_COMPUTEMODE_DEFAULT
    nvml.nvmlDeviceSetComputeMode(h, nvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    assert nvml.nvmlDeviceGetComputeMode(h) == nvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    other = nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetComputeMode(other) == nvml.NVML_COMPUTEMODE_DEFAULT
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceSetComputeMode(h, 7)


def _remote_buses(nvml, index: int) -> list[str]:
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    out = []
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            assert nvml.nvmlDeviceGetNvLinkState(h, link) == nvml.NVML_FEATURE_ENABLED
        except nvml.NVMLError_InvalidArgument:
            break
        out.append(nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
    return out


def test_nvlink_pairs_link_gpu_2k_to_2k_plus_1(start: Start) -> None:
    nvml = start("4xA100-80GB:nvlink=pairs").pynvml
    bus = [nvml.nvmlDeviceGetPciInfo(nvml.nvmlDeviceGetHandleByIndex(i)).busId for i in range(4)]
    assert _remote_buses(nvml, 0) == [bus[1]] * 12
    assert _remote_buses(nvml, 3) == [bus[2]] * 12
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, 0) == nvml.NVML_NVLINK_DEVICE_TYPE_GPU
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(nvml.c_nvmlGpuFabricInfoV_t()))


def test_nvlink_all_ends_at_nvswitches_shared_by_the_group(start: Start) -> None:
    nvml = start("8xH100-80GB+2xH100-80GB:nvlink=none").pynvml
    gpu_buses = {
        nvml.nvmlDeviceGetPciInfo(nvml.nvmlDeviceGetHandleByIndex(i)).busId for i in range(10)
    }
    switches = set(_remote_buses(nvml, 0))
    assert len(switches) == products.H100_80GB.nvswitches
    assert not switches & gpu_buses
    for i in range(8):
        assert len(_remote_buses(nvml, i)) == 18 and set(_remote_buses(nvml, i)) == switches
    h0 = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h0, 0) == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetNvLinkState(nvml.nvmlDeviceGetHandleByIndex(8), 0)


def test_gpus_without_nvlink(start: Start) -> None:
    nvml = start("1xL4").pynvml
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetNvLinkState(nvml.nvmlDeviceGetHandleByIndex(0), 0)


def test_fabric_reports_a_completed_clique(start: Start) -> None:
    nvml = start("4xH200-141GB:nvlink=fabric,cluster=rack-1,clique=3+4xH200-141GB").pynvml
    seen = set()
    for i in range(4):
        info = nvml.c_nvmlGpuFabricInfoV_t()
        nvml.nvmlDeviceGetGpuFabricInfoV(nvml.nvmlDeviceGetHandleByIndex(i), ctypes.byref(info))
        assert info.state == nvml.NVML_GPU_FABRIC_STATE_COMPLETED
        assert info.status == nvml.NVML_SUCCESS
        assert info.cliqueId == 3
        seen.add(bytes(info.clusterUuid))
    assert len(seen) == 1 and any(seen.pop())
    with pytest.raises(nvml.NVMLError_NotSupported):
        info = nvml.c_nvmlGpuFabricInfoV_t()
        nvml.nvmlDeviceGetGpuFabricInfoV(nvml.nvmlDeviceGetHandleByIndex(4), ctypes.byref(info))


def test_fabric_cluster_is_shared_across_nodes(start: Start) -> None:
    spec = "2xH100-80GB:nvlink=fabric,cluster=rack-9,clique=1"
    uuids = set()
    for node in ("node-a", "node-b"):
        nvml = start(spec, node=node, state_dir=None).pynvml
        info = nvml.c_nvmlGpuFabricInfoV_t()
        nvml.nvmlDeviceGetGpuFabricInfoV(nvml.nvmlDeviceGetHandleByIndex(0), ctypes.byref(info))
        uuids.add(bytes(info.clusterUuid))
    assert len(uuids) == 1


def test_handles_of_another_fake_are_rejected(start: Start) -> None:
    a = start("1xL4", node="a", state_dir=None).pynvml
    b = start("1xL4", node="b", state_dir=None).pynvml
    h = a.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(b.NVMLError_InvalidArgument):
        b.nvmlDeviceGetName(h)

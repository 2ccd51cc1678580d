"""MIG through the pynvml API of a fake node: profiles, placements, the admission rules and
their return codes, MIG device handles, persistence across a restart."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from fakenvml import load, products
from tests.support.fakes import Start

MIB = 1024 * 1024


def _profile(nvml, h, name: str):
    for index in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
        except nvml.NVMLError_NotSupported:
            continue
        if info.name == f"MIG {name}":
            return info
    raise AssertionError(f"no profile {name}")


def _create(nvml, h, name: str, start: int):
    """A MIG device: GPU instance at `start` plus its full-size compute instance."""
    info = _profile(nvml, h, name)
    placement = nvml.c_nvmlGpuInstancePlacement_t()
    placement.start, placement.size = start, _size(nvml, h, info.id)
    gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, info.id, ctypes.byref(placement))
    ci_index = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}[info.sliceCount]
    ci_info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, ci_index, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    )
    ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
    return gi, ci


def _size(nvml, h, profile_id: int) -> int:
    arr = (nvml.c_nvmlGpuInstancePlacement_t * 8)()
    count = ctypes.c_uint()
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, arr, ctypes.byref(count))
    return arr[0].size


def _mig_gpu(start: Start, spec: str = "1xA100-40GB:mig=on"):
    nvml = start(spec).pynvml
    return nvml, nvml.nvmlDeviceGetHandleByIndex(0)


@pytest.mark.parametrize(
    "product",
    [p for p in products.PRODUCTS.values() if p.mig_capable],
    ids=lambda p: p.key,
)
def test_profiles_match_the_facts(start: Start, product: products.Product) -> None:
    nvml = start(f"1x{product.key}").pynvml
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    seen = {}
    for index in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
        except nvml.NVMLError_NotSupported:
            continue
        seen[index] = info
        p = product.gi_profile_by_index(index)
        assert p is not None
        assert (info.id, info.name, info.sliceCount, info.instanceCount) == (
            p.id,
            f"MIG {p.name}",
            p.compute_slices,
            p.instance_count,
        )
        assert info.memorySizeMB == p.memory_mib and info.multiprocessorCount == p.multiprocessors
        count = ctypes.c_uint()
        # The NULL-array call pattern asks for the count only.
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, None, ctypes.byref(count))
        arr = (nvml.c_nvmlGpuInstancePlacement_t * count.value)()
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, arr, ctypes.byref(count))
        assert [(x.start, x.size) for x in arr] == [
            (s, p.memory_slices) for s in p.placement_starts
        ]
    ids = {i.id for i in seen.values()}
    assert ids == {p.id for p in product.gi_profiles}
    engines = {
        i.id: (i.decoderCount, i.encoderCount, i.jpegCount, i.ofaCount) for i in seen.values()
    }
    assert engines == {p.id: (p.decoders, p.encoders, p.jpegs, p.ofas) for p in product.gi_profiles}
    if product.gi_profiles[0].geometry.memory_slices != 8:
        return  # A30 and RTX PRO: their own IDs, checked in the NVIDIA layout tables
    assert ids == {19, 20, 15, 14, 9, 5, 0}
    assert seen[nvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1].id == 20
    assert seen[nvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2].id == 15
    assert seen[nvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE].id == 0
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, nvml.NVML_GPU_INSTANCE_PROFILE_COUNT)


def test_a100_40gb_profile_numbers(start: Start) -> None:
    nvml, h = _mig_gpu(start)
    one = _profile(nvml, h, "1g.5gb")
    assert (one.memorySizeMB, one.copyEngineCount, one.decoderCount) == (4864, 1, 0)
    me = _profile(nvml, h, "1g.5gb+me")
    assert (me.decoderCount, me.jpegCount, me.ofaCount, me.instanceCount) == (1, 1, 1, 1)
    seven = _profile(nvml, h, "7g.40gb")
    assert (seven.multiprocessorCount, seven.memorySizeMB, seven.copyEngineCount) == (98, 40192, 7)


def test_h100_profile_numbers(start: Start) -> None:
    nvml, h = _mig_gpu(start, "1xH100-80GB")
    double = _profile(nvml, h, "1g.20gb")
    assert (double.multiprocessorCount, double.memorySizeMB) == (26, 20096)
    seven = _profile(nvml, h, "7g.80gb")
    counts = (seven.copyEngineCount, seven.decoderCount, seven.jpegCount, seven.ofaCount)
    assert counts == (8, 7, 7, 1)


@pytest.mark.parametrize(
    "layout",
    [
        [("3g.20gb", 0), ("3g.20gb", 4)],
        [("4g.20gb", 0), ("2g.10gb", 4), ("1g.5gb", 6)],
        [("1g.10gb", 0), ("1g.10gb", 2), ("1g.10gb", 4), ("1g.10gb", 6)],
        [("1g.5gb", s) for s in range(7)],
        [("7g.40gb", 0)],
        [("4g.20gb", 0), ("3g.20gb", 4)],
    ],
)
def test_known_valid_layouts(start: Start, layout) -> None:
    nvml, h = _mig_gpu(start)
    for name, at in layout:
        _create(nvml, h, name, at)
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(h) == 7
    uuids = []
    for i in range(len(layout)):
        m = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
        uuids.append(nvml.nvmlDeviceGetUUID(m))
    assert len(set(uuids)) == len(layout) and all(u.startswith("MIG-") for u in uuids)
    for i in range(len(layout), 7):
        with pytest.raises(nvml.NVMLError_NotFound):
            nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)


def test_overlap_is_insufficient_resources(start: Start) -> None:
    nvml, h = _mig_gpu(start)
    _create(nvml, h, "4g.20gb", 0)
    with pytest.raises(nvml.NVMLError_InsufficientResources):
        _create(nvml, h, "3g.20gb", 0)
    with pytest.raises(nvml.NVMLError_InsufficientResources):
        _create(nvml, h, "1g.5gb", 3)


def test_a_second_media_extension_instance_fails(start: Start) -> None:
    nvml, h = _mig_gpu(start)
    _create(nvml, h, "1g.5gb+me", 0)
    with pytest.raises(nvml.NVMLError_InsufficientResources):
        _create(nvml, h, "1g.5gb+me", 1)
    _create(nvml, h, "1g.5gb", 1)


def test_a_placement_that_is_not_possible_is_invalid(start: Start) -> None:
    nvml, h = _mig_gpu(start)
    info = _profile(nvml, h, "3g.20gb")
    bad = nvml.c_nvmlGpuInstancePlacement_t(2, 4)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, info.id, ctypes.byref(bad))
    wrong_size = nvml.c_nvmlGpuInstancePlacement_t(0, 2)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, info.id, ctypes.byref(wrong_size))
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceCreateGpuInstance(h, 77)


def test_destroying_a_gpu_instance_with_a_compute_instance_is_in_use(start: Start) -> None:
    nvml, h = _mig_gpu(start)
    gi, ci = _create(nvml, h, "3g.20gb", 4)
    with pytest.raises(nvml.NVMLError_InUse):
        nvml.nvmlGpuInstanceDestroy(gi)
    nvml.nvmlComputeInstanceDestroy(ci)
    nvml.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlGpuInstanceGetInfo(gi)
    _create(nvml, h, "4g.20gb", 0)
    _create(nvml, h, "3g.20gb", 4)


def test_gpu_instance_ids_follow_the_placement(start: Start) -> None:
    nvml, h = _mig_gpu(start)
    ids = []
    for name, at in [("1g.5gb", 6), ("3g.20gb", 0), ("2g.10gb", 4)]:
        gi, _ = _create(nvml, h, name, at)
        ids.append(nvml.nvmlGpuInstanceGetInfo(gi).id)
    assert ids == [13, 1, 5]
    hopper = start("1xH100-80GB:mig=on", node="node-b").pynvml
    hh = hopper.nvmlDeviceGetHandleByIndex(0)
    gi, _ = _create(hopper, hh, "7g.80gb", 0)
    assert hopper.nvmlGpuInstanceGetInfo(gi).id == 0


def test_instance_infos_and_lookups(start: Start) -> None:
    nvml, h = _mig_gpu(start)
    gi, ci = _create(nvml, h, "2g.10gb", 2)
    info = nvml.nvmlGpuInstanceGetInfo(gi)
    assert (info.profileId, info.placement.start, info.placement.size) == (14, 2, 2)
    assert nvml.nvmlDeviceGetIndex(info.device) == 0
    again = nvml.nvmlDeviceGetGpuInstanceById(h, info.id)
    assert nvml.nvmlGpuInstanceGetInfo(again).id == info.id
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetGpuInstanceById(h, 0)
    handles = (nvml.c_nvmlGpuInstance_t * 3)()
    count = ctypes.c_uint()
    nvml.nvmlDeviceGetGpuInstances(h, 14, handles, ctypes.byref(count))
    assert count.value == 1 and nvml.nvmlGpuInstanceGetInfo(handles[0]).id == info.id
    ci_info = nvml.nvmlComputeInstanceGetInfo(ci)
    assert (ci_info.id, ci_info.profileId, ci_info.placement.size) == (0, 1, 2)
    assert nvml.nvmlGpuInstanceGetInfo(ci_info.gpuInstance).id == info.id
    cis = (nvml.c_nvmlComputeInstance_t * 2)()
    nvml.nvmlGpuInstanceGetComputeInstances(gi, 1, cis, ctypes.byref(count))
    assert count.value == 1
    assert nvml.nvmlComputeInstanceGetInfo(cis[0]).id == 0
    assert (
        nvml.nvmlComputeInstanceGetInfo(nvml.nvmlGpuInstanceGetComputeInstanceById(gi, 0)).id == 0
    )


def test_mig_device_handles(start: Start) -> None:
    nvml, h = _mig_gpu(start)
    _create(nvml, h, "3g.20gb", 4)
    m = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    is_mig = nvml.nvmlDeviceIsMigDeviceHandle(m)
    # pynvml returns the ctypes c_uint itself: test its truthiness; `== 1` is never true.
    assert isinstance(is_mig, ctypes.c_uint) and is_mig.value == 1
    assert is_mig and (is_mig == 1) is False
    assert not nvml.nvmlDeviceIsMigDeviceHandle(h)
    assert nvml.nvmlDeviceGetName(m) == "NVIDIA A100-SXM4-40GB MIG 3g.20gb"
    assert nvml.nvmlDeviceGetMemoryInfo(m).total == 19968 * MIB
    assert nvml.nvmlDeviceGetGpuInstanceId(m) == 2
    assert nvml.nvmlDeviceGetComputeInstanceId(m) == 0
    assert nvml.nvmlDeviceGetAttributes(m).multiprocessorCount == 42
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetAttributes(h)
    parent = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)
    assert nvml.nvmlDeviceGetUUID(parent) == nvml.nvmlDeviceGetUUID(h)
    uuid = nvml.nvmlDeviceGetUUID(m)
    assert nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByUUID(uuid)).endswith("MIG 3g.20gb")
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetGpuInstanceId(h)


def test_mig_uuids_are_fresh_when_recreated(start: Start) -> None:
    nvml, h = _mig_gpu(start)
    gi, ci = _create(nvml, h, "7g.40gb", 0)
    first = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0))
    nvml.nvmlComputeInstanceDestroy(ci)
    nvml.nvmlGpuInstanceDestroy(gi)
    _create(nvml, h, "7g.40gb", 0)
    second = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0))
    assert first != second


def test_mig_needs_mig_mode(start: Start) -> None:
    nvml, h = _mig_gpu(start, "1xA100-80GB")
    # Profiles and placements answer whatever the mode.
    info = _profile(nvml, h, "3g.40gb")
    assert _size(nvml, h, info.id) == 4
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceCreateGpuInstance(h, info.id)


def test_mig_calls_on_a_product_without_mig(start: Start) -> None:
    nvml, h = _mig_gpu(start, "1xL4")
    for call in (
        lambda: nvml.nvmlDeviceSetMigMode(h, nvml.NVML_DEVICE_MIG_ENABLE),
        lambda: nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, 0),
        lambda: nvml.nvmlDeviceCreateGpuInstance(h, 9),
    ):
        with pytest.raises(nvml.NVMLError_NotSupported):
            call()


def test_ampere_mig_mode_waits_for_a_reset(start: Start) -> None:
    fake = start("1xA100-40GB")
    nvml = fake.pynvml
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    status = nvml.nvmlDeviceSetMigMode(h, nvml.NVML_DEVICE_MIG_ENABLE)
    assert status == nvml.NVML_ERROR_RESET_REQUIRED
    assert nvml.nvmlDeviceGetMigMode(h) == [0, 1]
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceCreateGpuInstance(h, 9)
    fake.machine.reset_gpu(0)
    assert nvml.nvmlDeviceGetMigMode(h) == [1, 1]
    _create(nvml, h, "3g.20gb", 0)


def test_hopper_switches_mig_mode_at_once(start: Start) -> None:
    nvml, h = _mig_gpu(start, "1xH100-80GB")
    assert nvml.nvmlDeviceSetMigMode(h, nvml.NVML_DEVICE_MIG_ENABLE) == nvml.NVML_SUCCESS
    assert nvml.nvmlDeviceGetMigMode(h) == [1, 1]
    gi, ci = _create(nvml, h, "3g.40gb", 0)
    with pytest.raises(nvml.NVMLError_InUse):
        nvml.nvmlDeviceSetMigMode(h, nvml.NVML_DEVICE_MIG_DISABLE)
    nvml.nvmlComputeInstanceDestroy(ci)
    nvml.nvmlGpuInstanceDestroy(gi)
    nvml.nvmlDeviceSetMigMode(h, nvml.NVML_DEVICE_MIG_DISABLE)
    assert nvml.nvmlDeviceGetMigMode(h) == [0, 0]


def test_remaining_capacity(start: Start) -> None:
    nvml, h = _mig_gpu(start)
    one = _profile(nvml, h, "1g.5gb")
    assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(h, one.id) == 7
    _create(nvml, h, "3g.20gb", 4)
    assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(h, one.id) == 4
    assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 0) == 0


def test_mig_state_survives_a_restart(tmp_path: Path) -> None:
    first = load("2xA100-80GB:mig=on", node="n1", state_dir=tmp_path)
    nvml = first.pynvml
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    _create(nvml, h, "3g.40gb", 4)
    _create(nvml, h, "1g.10gb", 0)
    nvml.nvmlDeviceSetComputeMode(h, nvml.NVML_COMPUTEMODE_PROHIBITED)
    before = [
        nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)) for i in range(2)
    ]
    nvml.nvmlShutdown()
    assert (tmp_path / "fake-nvml-n1.json").exists()

    again = load("2xA100-80GB:mig=on", node="n1", state_dir=tmp_path).pynvml
    again.nvmlInit()
    h2 = again.nvmlDeviceGetHandleByIndex(1)
    after = [
        again.nvmlDeviceGetUUID(again.nvmlDeviceGetMigDeviceHandleByIndex(h2, i)) for i in range(2)
    ]
    assert after == before
    assert again.nvmlDeviceGetComputeMode(h2) == again.NVML_COMPUTEMODE_PROHIBITED
    with pytest.raises(again.NVMLError_InsufficientResources):
        _create(again, h2, "4g.40gb", 0)
    other = load("2xA100-80GB:mig=on", node="n2", state_dir=tmp_path).pynvml
    other.nvmlInit()
    with pytest.raises(other.NVMLError_NotFound):
        other.nvmlDeviceGetMigDeviceHandleByIndex(other.nvmlDeviceGetHandleByIndex(1), 0)


def test_pending_mig_mode_survives_a_restart_but_not_a_reboot(tmp_path: Path) -> None:
    nvml = load("1xA100-40GB", node="n", state_dir=tmp_path).pynvml
    nvml.nvmlInit()
    nvml.nvmlDeviceSetMigMode(nvml.nvmlDeviceGetHandleByIndex(0), 1)
    fake = load("1xA100-40GB", node="n", state_dir=tmp_path)
    fake.pynvml.nvmlInit()
    h = fake.pynvml.nvmlDeviceGetHandleByIndex(0)
    assert fake.pynvml.nvmlDeviceGetMigMode(h) == [0, 1]
    fake.machine.reboot()
    assert fake.pynvml.nvmlDeviceGetMigMode(h) == [1, 1]


def test_state_of_another_machine_is_refused(tmp_path: Path) -> None:
    load("2xH100-80GB", node="n", state_dir=tmp_path)
    with pytest.raises(ValueError, match="other GPUs than this device spec"):
        load("2xA100-80GB", node="n", state_dir=tmp_path)


def test_fleet_mig_devices_exist_at_first_start(start: Start, tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "gpus:\n"
        "  - product: H100-80GB\n"
        "    count: 2\n"
        "    mig: on\n"
        "    migDevices:\n"
        "      - {gpu: 1, profile: 3g.40gb, placement: 4}\n"
        "      - {gpu: 1, profile: 1g.10gb, placement: 0}\n"
    )
    nvml = start(f"fake:@{fleet}").pynvml
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    names = [
        nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)) for i in range(2)
    ]
    assert sorted(names) == [
        "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
        "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
    ]
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(nvml.nvmlDeviceGetHandleByIndex(0), 0)


def test_smaller_compute_instances(start: Start) -> None:
    nvml, h = _mig_gpu(start)
    info = _profile(nvml, h, "3g.20gb")
    gi = nvml.nvmlDeviceCreateGpuInstance(h, info.id)
    one = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 0, 0)
    assert (one.name, one.instanceCount, one.multiprocessorCount) == ("MIG 1c.3g.20gb", 3, 14)
    for _ in range(3):
        nvml.nvmlGpuInstanceCreateComputeInstance(gi, one.id)
    with pytest.raises(nvml.NVMLError_InsufficientResources):
        nvml.nvmlGpuInstanceCreateComputeInstance(gi, one.id)
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 3, 0)
    m = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 2)
    assert nvml.nvmlDeviceGetName(m) == "NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb"

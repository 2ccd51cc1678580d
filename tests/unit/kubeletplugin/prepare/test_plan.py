"""The pure prepare planner: the per-claim errors a user sees, and the record of what
prepare will do, from plain values (a claim, the node's devices, a checkpoint)."""

from __future__ import annotations

from typing import Any

import pytest

from dradriver.errors import ConfigError, DeviceError, DriverError
from dradriver.inventory.naming import uuid_digits
from dradriver.inventory.node_devices import MigMode
from dradriver.kubeletplugin.prepare.claim_devices import check_ref, claim_devices
from dradriver.kubeletplugin.prepare.plan import plan
from dradriver.kubeletplugin.state.records import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    Checkpoint,
    ClaimRecord,
    ClaimRef,
    Mps,
    PreparedDevice,
    TimeSlicing,
)
from tests.support.plan_claims import (
    CFG,
    DRIVER,
    MPS,
    POOL,
    REF,
    claim,
    h100_devices,
    named,
    result,
    with_config,
)


@pytest.mark.parametrize(
    "ref, message",
    [
        (ClaimRef("team", "", "x"), "empty UID"),
        (ClaimRef("team", "../x", "x"), "not a Kubernetes UID"),
        (ClaimRef("team", REF.uid, "a/b"), "not a valid Kubernetes name"),
        (ClaimRef("..", REF.uid, "x"), "not a valid Kubernetes name"),
        (ClaimRef("team", REF.uid, ".hidden"), "not a valid Kubernetes name"),
        (ClaimRef("", REF.uid, "x"), "not a valid Kubernetes name"),
    ],
)
def test_refs_that_could_escape_or_mislead_are_refused(ref: ClaimRef, message: str) -> None:
    with pytest.raises(DriverError, match=message):
        check_ref(ref)


def test_replaced_claim() -> None:
    with pytest.raises(DriverError, match=r"was replaced.*UID"):
        claim_devices(claim([result("gpu-0")], uid="other"), REF, DRIVER, pool=POOL)


def test_not_allocated_and_not_reserved() -> None:
    with pytest.raises(DriverError, match="not allocated"):
        claim_devices(claim(None), REF, DRIVER, pool=POOL)
    with pytest.raises(DriverError, match="not reserved for any pod"):
        claim_devices(claim([result("gpu-0")], reserved=False), REF, DRIVER, pool=POOL)


def test_only_our_results_and_our_pool() -> None:
    p = claim_devices(
        claim([result("gpu-0"), result("nic-1", driver="net.example.com")]), REF, DRIVER, pool=POOL
    )
    assert [d.device for d in p.devices] == ["gpu-0"]
    with pytest.raises(DriverError, match="no device of driver"):
        claim_devices(claim([result("nic-1", driver="net.example.com")]), REF, DRIVER, pool=POOL)
    with pytest.raises(DriverError, match="pool 'node-b'"):
        claim_devices(claim([result("gpu-0", pool="node-b")]), REF, DRIVER, pool=POOL)


def test_subrequest_suffix_is_stripped_for_the_kubelet() -> None:
    p = claim_devices(claim([result("gpu-0", request="gpu/h100")]), REF, DRIVER, pool=POOL)
    assert p.devices[0].request == "gpu/h100" and p.devices[0].request_name == "gpu"


def test_configs_in_precedence_order_per_request() -> None:
    cls = {
        "source": "FromClass",
        "requests": None,
        "opaque": {"driver": DRIVER, "parameters": {**CFG, "tag": "class"}},
    }
    for_a = {
        "source": "FromClaim",
        "requests": ["a"],
        "opaque": {"driver": DRIVER, "parameters": {**CFG, "tag": "claim-a"}},
    }
    for_sub = {
        "source": "FromClaim",
        "requests": ["b/h100"],
        "opaque": {"driver": DRIVER, "parameters": {**CFG, "tag": "claim-b-h100"}},
    }
    other = {
        "source": "FromClaim",
        "requests": None,
        "opaque": {"driver": "net.example.com", "parameters": {"x": 1}},
    }
    # The API server lists class configs first; we do not rely on it.
    p = claim_devices(
        claim(
            [result("gpu-0", "a"), result("gpu-1", "b/h100"), result("gpu-2", "c")],
            configs=[for_a, other, cls, for_sub],
        ),
        REF,
        DRIVER,
        pool=POOL,
    )
    tags = {d.device: [c["tag"] for c in d.configs] for d in p.devices}
    assert tags == {
        "gpu-0": ["class", "claim-a"],
        "gpu-1": ["class", "claim-b-h100"],
        "gpu-2": ["class"],
    }


def test_plan_records_minor_carve_intent_and_request_names() -> None:
    devices = h100_devices()
    gpu1, part3g = named("gpu-1"), named("gpu-0-mig-3g40gb-4")
    c = claim([result(gpu1), result(part3g, "mig"), result(gpu1, "again")])
    rec = plan(c, REF, driver=DRIVER, node=POOL, devices=devices, checkpoint=Checkpoint(), now=5.0)
    assert (rec.uid, rec.state, rec.updated_at) == (REF.uid, PREPARE_STARTED, 5.0)
    whole, part = rec.devices
    assert (whole.device, whole.kind, whole.request_names) == (gpu1, "gpu", ["gpus", "again"])
    assert whole.uuid == devices[gpu1].gpu.uuid and whole.minor == 1 and whole.carve is None
    # The CDI device is named after the GPU's UUID.
    digits = uuid_digits(devices[gpu1].gpu.uuid)[:8]
    assert whole.cdi_device_ids == [f"{DRIVER}/claim=gpu-{digits}-{REF.uid}"]
    assert part.device == part3g
    assert (part.kind, part.uuid, part.minor) == ("mig", None, 0)
    assert part.carve is not None and not part.carve.created
    assert (part.carve.profile, part.carve.placement_start, part.carve.placement_size) == (
        "3g.40gb",
        4,
        4,
    )


def test_with_driver_files_each_device_also_names_the_nodes_driver_spec() -> None:
    devices = h100_devices()
    gpu1, part3g = named("gpu-1"), named("gpu-0-mig-3g40gb-4")
    c = claim([result(gpu1), result(part3g, "mig")])
    kw: dict[str, Any] = dict(driver=DRIVER, node=POOL, devices=devices, now=5.0)
    rec = plan(c, REF, checkpoint=Checkpoint(), driver_files=True, **kw)
    for d in rec.devices:
        assert d.cdi_device_ids == [
            f"{DRIVER}/claim={d.cdi_name}-{REF.uid}",
            f"{DRIVER}/driver=files",
        ]
    plain = plan(c, REF, checkpoint=Checkpoint(), **kw)
    assert [d.cdi_device_ids[:1] for d in rec.devices] == [d.cdi_device_ids for d in plain.devices]


def test_each_device_of_a_claim_is_first_named_by_an_id_of_its_own() -> None:
    """The kubelet names a device by its first CDI ID in the pod's allocatedResources-
    Status and the API server refuses a duplicate within a claim (Q14b: every GPU first
    named the node's driver spec, and a pod with two GPUs never reported Running)."""
    devices = h100_devices()
    c = claim(
        [
            result(named("gpu-1")),
            result(named("gpu-0-mig-3g40gb-0"), "mig"),
            result(named("gpu-0-mig-3g40gb-4"), "mig"),
        ]
    )
    rec = plan(
        c,
        REF,
        driver=DRIVER,
        node=POOL,
        devices=devices,
        now=5.0,
        checkpoint=Checkpoint(),
        driver_files=True,
    )
    first = [d.cdi_device_ids[0] for d in rec.devices]
    assert len(first) == 3 and len(set(first)) == 3
    assert all("/driver=" not in i for i in first)


def test_plan_records_the_sharing_setup_without_applying_it() -> None:
    devices = h100_devices(MigMode.NONE)
    rec = plan(
        with_config([result(named("gpu-0"))], MPS),
        REF,
        driver=DRIVER,
        node=POOL,
        devices=devices,
        checkpoint=Checkpoint(),
        now=0.0,
    )
    (d,) = rec.devices
    assert isinstance(d.sharing, Mps) and not d.sharing.applied and d.sharing.daemon is None
    assert d.sharing.limits.active_thread_percentage == 40
    sliced = {
        **CFG,
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
    }
    rec = plan(
        with_config([result(named("gpu-0"))], sliced),
        REF,
        driver=DRIVER,
        node=POOL,
        devices=devices,
        checkpoint=Checkpoint(),
        now=0.0,
    )
    assert rec.devices[0].sharing == TimeSlicing("Long")


def test_plan_refuses_what_the_node_cannot_give() -> None:
    devices = h100_devices()
    args: dict[str, Any] = dict(driver=DRIVER, node=POOL, devices=devices, now=0.0)
    with pytest.raises(DeviceError, match="gpu-9 is not published"):
        plan(claim([result("gpu-9")]), REF, checkpoint=Checkpoint(), **args)
    # A partition overlapping a device another claim holds: the hardware is taken.
    held = ClaimRecord(
        "other-uid",
        "team",
        "other",
        PREPARE_COMPLETED,
        [PreparedDevice(["gpus"], POOL, named("gpu-0-mig-1g10gb-5"), [])],
    )
    cp = Checkpoint(claims={"other-uid": held})
    with pytest.raises(DeviceError, match="already prepared for claim team/other") as busy:
        plan(claim([result(named("gpu-0-mig-3g40gb-4"))]), REF, checkpoint=cp, **args)
    assert busy.value.reason == "device_busy"
    plan(claim([result(named("gpu-0-mig-3g40gb-0"))]), REF, checkpoint=cp, **args)  # no overlap
    with pytest.raises(ConfigError, match="GpuConfig does not fit a mig device"):
        plan(with_config([result(named("gpu-0-mig-1g10gb-0"))], CFG), REF, checkpoint=cp, **args)

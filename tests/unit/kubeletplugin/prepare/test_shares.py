"""Prepare per share (consumable capacity), pure: each allocation result with a shareID
is its own record, CDI device and status entry, with the limits its consumedCapacity
comes to; shares of one device stand beside each other and beside nothing else."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from dradriver.errors import DeviceError, DriverError
from dradriver.inventory.naming import uuid_digits
from dradriver.inventory.node_devices import MigMode
from dradriver.kubeletplugin.hardware.shares import share_edits
from dradriver.kubeletplugin.prepare.claim_status import _entry
from dradriver.kubeletplugin.prepare.plan import ClaimRef, plan
from dradriver.kubeletplugin.state.files import from_json, to_json
from dradriver.kubeletplugin.state.records import (
    PREPARE_COMPLETED,
    Checkpoint,
    ClaimRecord,
    PreparedDevice,
    Share,
)
from dradriver.slices.consumable import parse_mode
from tests.support.plan_claims import DRIVER, POOL, claim, h100_devices, named, result

GI = 2**30
MI = 2**20
H100 = 81559 * MI
A = ClaimRef("team", "aaaaaaaa-1111-2222-3333-444455556666", "a")
B = ClaimRef("team", "bbbbbbbb-1111-2222-3333-444455556666", "b")
S1, S2, S3 = (f"{n}{n}{n}{n}0000-0000-4000-8000-00000000000{n}" for n in (1, 2, 3))


def shared(
    device: str, share: str, consumed: dict[str, str], request: str = "gpu"
) -> dict[str, Any]:
    return {**result(device, request), "shareID": share, "consumedCapacity": consumed}


def planned(
    ref: ClaimRef, results: list[dict[str, Any]], mode: str = "memory", cp: Checkpoint | None = None
) -> ClaimRecord:
    # The scenario names devices by NVML index; the claim holds the node's names.
    c = claim([{**r, "device": named(r["device"])} for r in results], uid=ref.uid)
    c["metadata"]["name"] = ref.name
    return plan(
        c,
        ref,
        driver=DRIVER,
        node=POOL,
        devices=h100_devices(MigMode.NONE),
        checkpoint=cp or Checkpoint(),
        now=1.0,
        consumable=parse_mode(mode),
    )


def test_a_share_is_its_own_cdi_device_with_its_limits() -> None:
    rec = planned(A, [shared("gpu-0", S1, {"memory": "20Gi", "compute": "30"})])
    (d,) = rec.devices
    assert d.share == Share(S1, (("compute", "30"), ("memory", "20Gi")), 20 * GI, 30, pods=("u",))
    gpu = f"gpu-{uuid_digits(h100_devices(MigMode.NONE)[named('gpu-0')].gpu.uuid)[:8]}"
    assert d.cdi_device_ids == [f"{DRIVER}/claim={gpu}-share-{S1}-{A.uid}"]
    # Not joined to a daemon yet: what it was allocated, and no MPS client's edits.
    assert share_edits(d) == (
        [
            f"DRADRIVER_SHARE_ID={S1}",
            f"DRADRIVER_SHARE_MEMORY_LIMIT={20 * GI}",
            "DRADRIVER_SHARE_COMPUTE_LIMIT=30",
        ],
        [],
    )
    # The checkpoint keeps it whole.
    back = from_json(PreparedDevice, to_json(d), "d")
    assert back == d
    assert back.share is not None and (back.device, back.share.share_id) == (named("gpu-0"), S1)


def test_two_shares_of_one_device_in_one_claim_stay_two() -> None:
    rec = planned(
        A,
        [
            shared("gpu-0", S1, {"memory": "10Gi", "compute": "0"}, "a"),
            shared("gpu-0", S2, {"memory": "30Gi", "compute": "0"}, "b"),
        ],
    )
    assert [(d.device, d.request_names) for d in rec.devices] == [
        (named("gpu-0"), ["a"]),
        (named("gpu-0"), ["b"]),
    ]
    assert len({d.cdi_device_ids[0] for d in rec.devices}) == 2
    assert [d.share.memory_limit for d in rec.devices if d.share] == [10 * GI, 30 * GI]
    assert [d.share.compute_limit for d in rec.devices if d.share] == [None, None]


def done(rec: ClaimRecord) -> Checkpoint:
    rec = dataclasses.replace(rec, state=PREPARE_COMPLETED)
    return Checkpoint(claims={rec.uid: rec})


def test_shares_of_one_device_stand_beside_each_other_not_beside_a_whole_claim() -> None:
    cp = done(planned(A, [shared("gpu-0", S1, {"memory": "20Gi"})]))
    planned(B, [shared("gpu-0", S2, {"memory": "20Gi"})], cp=cp)  # no error
    with pytest.raises(DeviceError, match="already prepared for claim team/a"):
        planned(B, [result("gpu-0", "gpu")], cp=cp)
    whole = done(planned(A, [result("gpu-0", "gpu")]))
    with pytest.raises(DeviceError, match="already prepared for claim team/a"):
        planned(B, [shared("gpu-0", S2, {"memory": "20Gi"})], cp=whole)


@pytest.mark.parametrize(
    "mode, consumed, memory, compute",
    [
        ("memory", {"memory": "81559Mi", "compute": "0"}, H100, None),  # asked for nothing
        ("memory", {"memory": "1500Mi", "compute": "100"}, 1500 * MI, 100),
        ("shares=4", {"shares": "1", "memory": "0", "compute": "0"}, H100 // 4 // MI * MI, 25),
        ("shares=4", {"shares": "2", "memory": "0", "compute": "0"}, H100 // 2 // MI * MI, 50),
        ("shares=3", {"shares": "1", "memory": "8Gi", "compute": "0"}, 8 * GI, 33),
        ("unlimited", {"memory": "0", "compute": "0"}, None, None),
        ("unlimited", {"memory": "4Gi", "compute": "0"}, 4 * GI, None),
    ],
)
def test_limits_by_mode(
    mode: str, consumed: dict[str, str], memory: int | None, compute: int | None
) -> None:
    (d,) = planned(A, [shared("gpu-0", S1, consumed)], mode).devices
    assert d.share is not None
    assert (d.share.memory_limit, d.share.compute_limit) == (memory, compute)


@pytest.mark.parametrize(
    "consumed, message",
    [
        ({"memory": "lots"}, "not a quantity"),
        ({"memory": "-1Gi"}, "negative"),
        ({"memory": "100Gi"}, "more than the device has"),
        ({"compute": "101"}, "more than 100%"),
    ],
)
def test_a_bad_allocation_is_refused_naming_claim_device_and_share(
    consumed: dict[str, str], message: str
) -> None:
    with pytest.raises(DriverError, match=message) as e:
        planned(A, [shared("gpu-0", S1, consumed)])
    assert f"claim team/a: device {named('gpu-0')}, share {S1}" in str(e.value)


def test_status_entries_are_keyed_by_share() -> None:
    rec = planned(A, [shared("gpu-0", S1, {"memory": "20Gi", "compute": "30"})])
    (d,) = rec.devices
    e = _entry(DRIVER, d, "2026-12-02T00:00:00Z")
    assert (e["device"], e["shareID"]) == (named("gpu-0"), S1)
    assert e["data"]["limits"] == {"memory": 20 * GI, "compute": 30}
    (whole,) = planned(B, [result("gpu-1", "gpu")]).devices
    assert "shareID" not in _entry(DRIVER, whole, "2026-12-02T00:00:00Z")


def test_a_share_with_a_sharing_config_is_refused_at_prepare() -> None:
    from tests.support.plan_claims import CFG

    c = claim(
        [shared(named("gpu-0"), S1, {"memory": "20Gi"})],
        uid=A.uid,
        configs=[
            {
                "source": "FromClass",
                "requests": None,
                "opaque": {"driver": DRIVER, "parameters": {**CFG, "sharing": {"strategy": "MPS"}}},
            }
        ],
    )
    with pytest.raises(
        DriverError, match=r"share .*: an MPS config applies to a device held whole"
    ):
        plan(
            c,
            A,
            driver=DRIVER,
            node=POOL,
            devices=h100_devices(MigMode.NONE),
            checkpoint=Checkpoint(),
            now=1.0,
            consumable=parse_mode("memory"),
        )


def test_the_node_refuses_shares_that_oversubscribe_a_device() -> None:
    """The 1.34 scheduler can allocate past a device's capacity (kubernetes#133705): the
    node does not hand it out."""
    cp = done(planned(A, [shared("gpu-0", S1, {"memory": "60Gi", "compute": "80"})]))
    with pytest.raises(
        DeviceError, match=r"would give out .* memory: the allocation oversubscribes"
    ):
        planned(B, [shared("gpu-0", S2, {"memory": "20Gi", "compute": "0"})], cp=cp)
    with pytest.raises(DeviceError, match="of its 100 compute"):
        planned(B, [shared("gpu-0", S2, {"memory": "1Gi", "compute": "30"})], cp=cp)
    planned(B, [shared("gpu-0", S2, {"memory": "19Gi", "compute": "20"})], cp=cp)  # fits
    planned(B, [shared("gpu-1", S2, {"memory": "79Gi", "compute": "100"})], cp=cp)  # another
    # Two shares of one device in one claim count together; shares=N counts shares.
    with pytest.raises(DeviceError, match="oversubscribes"):
        planned(
            B,
            [
                shared("gpu-1", S2, {"memory": "50Gi"}, "a"),
                shared("gpu-1", S3, {"memory": "50Gi"}, "b"),
            ],
        )
    four = done(planned(A, [shared("gpu-0", S1, {"shares": "4"})], "shares=4"))
    with pytest.raises(DeviceError, match="of its 4 shares"):
        planned(B, [shared("gpu-0", S2, {"shares": "1"})], "shares=4", cp=four)

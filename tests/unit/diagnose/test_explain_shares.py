"""explain on shared devices (consumable capacity): slices built by the driver's own code
in each mode, claims with capacity requests and allocations with shareIDs as the 1.34
scheduler writes them (consumedCapacity rounded by the requestPolicy)."""

from __future__ import annotations

from typing import Any

from dradriver.api.quantity import parse
from dradriver.diagnose.capacity import Capacity, Policy, capacities, consumption, fit, violates
from dradriver.nvml.library import open_nvml
from dradriver.slices.build import build
from dradriver.slices.consumable import parse_mode
from dradriver.slices.publish import render
from tests.support.explain import D, line, node, run
from tests.support.gpu_names import fake_names

GI = 2**30
# The H100's name on node-a in every spec here (the spec's first GPU).
H100 = fake_names("1xH100-80GB", "node-a")[0]


def shared_slices(node_name: str, spec: str, mode: str) -> list[dict[str, Any]]:
    from dradriver.inventory.node_devices import MigMode

    found = open_nvml(f"fake:{spec}", node=node_name, state_dir=None).discover()
    return render(
        D, node_name, build(found.inventory, MigMode.NONE, consumable=parse_mode(mode)).slices
    )


def share_claim(
    name: str, asks: dict[str, str] | None = None, held: dict[str, str] | None = None
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": D}
    if asks:
        exactly["capacity"] = {"requests": asks}
    c: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }
    if held is not None:
        c["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": D,
                            "pool": "node-a",
                            "device": H100,
                            "shareID": f"0000000{len(name)}-{name[:4]:0>4}-4000-8000-000000000000",
                            "consumedCapacity": held,
                        }
                    ]
                }
            }
        }
    return c


def test_the_schedulers_rounding_and_policy_rules() -> None:
    mem = Capacity(parse("81559Mi"), Policy(parse("81559Mi"), parse("1Gi"), None, parse("1Mi")))
    assert consumption(None, mem) == parse("81559Mi")  # asks nothing: the default
    assert consumption(parse("100Mi"), mem) == GI  # below min: min
    assert consumption(parse("20.5Gi"), mem) == parse("20992Mi")  # whole steps from min
    shares = Capacity(parse("4"), Policy(parse("1"), parse("1"), parse("4"), parse("1")))
    assert violates(parse("5"), shares) and not violates(parse("4"), shares)
    assert not violates(parse("1"), shares)
    plain = Capacity(parse("100"))
    assert consumption(None, plain) == 100  # no policy: all of it
    # Naming a capacity the device lacks never fits; a whole device only filters.
    assert fit({"memory": mem}, True, {"bogus": parse("1")}, held={}).why == "missing"
    assert fit({"memory": plain}, False, {"memory": parse("101")}, held={}).why == "size"
    assert fit({"memory": plain}, False, {"memory": parse("100")}, held={}).ok


def test_published_policies_read_back() -> None:
    (s,) = shared_slices("node-a", "1xH100-80GB", "memory")
    caps = capacities(s["spec"]["devices"][0])
    assert caps["memory"].policy == Policy(parse("81559Mi"), GI, None, parse("1Mi"))
    assert caps["compute"].value == 100


def test_a_30gi_share_beside_three_20gi_ones_names_the_most_free_memory() -> None:
    sl = shared_slices("node-a", "1xH100-80GB", "memory")
    held = [share_claim(n, {"memory": "20Gi"}, {"memory": "20Gi", "compute": "0"}) for n in "abc"]
    r = run(share_claim("big", {"memory": "30Gi"}), sl, [node("node-a")], held)
    text = line(r)
    assert text.startswith(
        "capacity: request gpu asks for memory 30Gi, which takes 30Gi of memory; the most "
        f"free memory on any {D} device is 19.6Gi, on {H100} of node-a, where 3 shares hold 60Gi"
    ), text
    assert "Fix: ask for at most 19.6Gi of memory" in text
    (req,) = r.requests
    assert req.rows[0].short == 1 and req.rows[0].free == 0
    (shared,) = req.shares
    assert shared.startswith(f"{H100} of node-a: 3 shares (default/a, default/b, default/c);")
    assert "memory 60Gi of 79.6Gi (19.6Gi free)" in shared
    # The same claim fits once a share goes.
    r = run(share_claim("big", {"memory": "30Gi"}), sl, [node("node-a")], held[:2])
    assert r.finding is None


def test_more_than_any_device_has_names_the_largest() -> None:
    sl = shared_slices("node-a", "1xH100-80GB+1xL4", "memory")
    h100 = fake_names("1xH100-80GB+1xL4", "node-a")[0]
    text = line(run(share_claim("c", {"memory": "100Gi"}), sl, [node("node-a")]))
    assert text.startswith(
        "capacity: request gpu asks for memory 100Gi; the largest memory of any "
        f"{D} device is 79.6Gi ({h100} of node-a, NVIDIA H100 80GB HBM3)"
    ), text


def test_off_the_policy_and_unknown_capacities() -> None:
    sl = shared_slices("node-a", "1xH100-80GB", "shares=4")
    text = line(run(share_claim("c", {"shares": "5"}), sl, [node("node-a")]))
    assert f"which would take shares 5; {H100} of node-a allows a claim shares from 1 to 4" in text
    text = line(run(share_claim("c", {"vram": "1Gi"}), sl, [node("node-a")]))
    assert "asks for capacity vram, which no gpu.dradriver.io device has" in text
    assert f"({H100} of node-a has compute, memory, shares)" in text


def test_a_fifth_share_of_four() -> None:
    sl = shared_slices("node-a", "1xH100-80GB", "shares=4")
    held = [share_claim(n, None, {"shares": "1", "memory": "0", "compute": "0"}) for n in "abcd"]
    text = line(run(share_claim("e"), sl, [node("node-a")], held))
    assert f"the most free shares on any gpu.dradriver.io device is 0, on {H100} of node-a" in text

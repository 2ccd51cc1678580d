"""One device as a ResourceSlice lists it: its name, the attributes a claim selects it by
and its capacities (pure).

Its own file because what a device says of itself is a contract with users' claims
(docs/user-guide.md, "Selecting GPUs by attribute") that changes for reasons of its own:
build.py decides which slice each device goes in for the API server's line, and checks
the result against its limits, whatever the devices say.
"""

from __future__ import annotations

from typing import Any

from dradriver.inventory.model import Gpu, Inventory
from dradriver.inventory.node_devices import DeviceKind, NodeDevice
from dradriver.slices.consumable import OFF, Consumable, capacity

STANDARD_DOMAIN = "resource.kubernetes.io"


def _s(v: str) -> dict[str, Any]:
    return {"string": v}


def _gpu_attributes(inv: Inventory, gpu: Gpu) -> dict[str, dict[str, Any]]:
    """Everything a claim may select a whole GPU by (docs/user-guide.md,
    "Selecting GPUs by attribute")."""
    a: dict[str, dict[str, Any]] = {
        "type": _s("gpu"),
        "uuid": _s(gpu.uuid),
        "index": {"int": gpu.index},
        "minor": {"int": gpu.minor},
        "migCapable": {"bool": gpu.mig_capable},
        "productName": _s(gpu.product_name),
        "brand": _s(gpu.brand),
        "architecture": _s(gpu.architecture),
        "cudaComputeCapability": {"version": gpu.cuda_compute_capability},
        "driverVersion": {"version": inv.driver_version},
        "cudaDriverVersion": {"version": inv.cuda_driver_version},
        f"{STANDARD_DOMAIN}/pciBusID": _s(gpu.pci_bus_id),
    }
    a.update(_placement(gpu))
    if gpu.nvlink_domain:
        a["nvlinkDomain"] = _s(gpu.nvlink_domain)
    return a


def _placement(gpu: Gpu) -> dict[str, dict[str, Any]]:
    """Where the GPU sits: what a claim aligns other devices with (matchAttribute)."""
    a: dict[str, dict[str, Any]] = {}
    if gpu.pcie_root:
        a[f"{STANDARD_DOMAIN}/pcieRoot"] = _s(gpu.pcie_root)
    if gpu.numa_node is not None:
        a["numaNode"] = {"int": gpu.numa_node}
    return a


def _mig_attributes(dev: NodeDevice) -> dict[str, dict[str, Any]]:
    """What a claim selects a MIG device by, and nothing more. In dynamic mode every
    profile x placement of every GPU is a device, some 200 a node, so every attribute is
    paid for that many times: in the bytes published, in the API server's and the
    scheduler's memory, and in every CEL evaluation (which rebuilds the device's
    attribute map each time). Kept: the type and profile (what the classes and claims
    select), the product (a claim across products), the parent (same-GPU or
    different-GPU constraints, and which GPU it is) and the PCIe root (alignment with
    other drivers' devices), and the memory as capacity (a size across products).
    Left to the whole GPU: facts of the product or the node (brand, architecture,
    compute capability, driver versions), of the PCI function (pciBusID, NUMA node:
    a MIG device is no PCI function of its own) and what the profile already says
    (its SMs and engines; `dradriver devices` lists them). The placement is in the
    device's name (gpu-9b3c2810-mig-3g40gb-4). No NVLink domain: MIG devices have no
    peer-to-peer with other GPUs (MIG User Guide, R570: "P2P between MIG instances on
    different GPUs ... not supported"), so a claim matching nvlinkDomain must never be
    handed MIG devices."""
    gpu = dev.gpu
    a: dict[str, dict[str, Any]] = {"type": _s("mig")}
    if dev.mig is not None:  # it exists: it has a UUID of its own
        a["uuid"] = _s(dev.mig.uuid)
    a["parentUUID"] = _s(gpu.uuid)
    a["profile"] = _s(str(dev.profile_name))
    a["productName"] = _s(gpu.product_name)
    if gpu.pcie_root:
        a[f"{STANDARD_DOMAIN}/pcieRoot"] = _s(gpu.pcie_root)
    return a


def _capacity(memory_bytes: int, sms: int | None = None) -> dict[str, Any]:
    cap: dict[str, Any] = {"memory": {"value": str(memory_bytes)}}
    if sms is not None:
        cap["multiprocessors"] = {"value": str(sms)}
    return cap


def render(inv: Inventory, dev: NodeDevice, consumable: Consumable = OFF) -> dict[str, Any]:
    """One device of a ResourceSlice, without counters (pure). A MIG device's engines
    are its profile's (`dradriver devices` lists them): a claim names the profile. With
    consumable capacity on, whole GPUs and existing MIG devices allow multiple
    allocations (consumable.py); partitions never do (dynamic MIG refuses the mode)."""
    gpu = dev.gpu
    if dev.kind is DeviceKind.GPU:
        out: dict[str, Any] = {"name": dev.name, "attributes": _gpu_attributes(inv, gpu)}
        if consumable.on:
            out["capacity"] = capacity(consumable, gpu.memory_bytes, gpu.multiprocessors)
            out["allowMultipleAllocations"] = True
        else:
            out["capacity"] = _capacity(gpu.memory_bytes, gpu.multiprocessors)
        return out
    if dev.mig is not None:
        if consumable.on:
            return {
                "name": dev.name,
                "attributes": _mig_attributes(dev),
                "capacity": capacity(consumable, dev.mig.memory_bytes, dev.mig.multiprocessors),
                "allowMultipleAllocations": True,
            }
        memory = dev.mig.memory_bytes
    else:
        assert dev.partition is not None
        memory = dev.partition.profile.memory_bytes
    return {"name": dev.name, "attributes": _mig_attributes(dev), "capacity": _capacity(memory)}

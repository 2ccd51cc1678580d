"""The plugin's prepare stack over a fake node, wired as dradriver.kubeletplugin.main
wires it, for unit tests: claims are handed in as plain values instead of read from an
API server."""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dradriver.api.config import API_VERSION
from dradriver.inventory.node_devices import MigMode, MigSwitching, NodeDevice
from dradriver.kubeletplugin.endpoints.metrics import Metrics
from dradriver.kubeletplugin.hardware.mig import MigPreparer
from dradriver.kubeletplugin.hardware.pod_memory import PodMemory
from dradriver.kubeletplugin.hardware.shares import ShareSteps
from dradriver.kubeletplugin.hardware.sharing import SharingSteps
from dradriver.kubeletplugin.prepare.cdi import CdiWriter
from dradriver.kubeletplugin.prepare.execute import Executor
from dradriver.kubeletplugin.prepare.plan import ClaimRef
from dradriver.kubeletplugin.prepare.preparer import Preparer
from dradriver.kubeletplugin.state.checkpoint import CheckpointStore
from dradriver.kubeletplugin.state.files import FileLock
from dradriver.kubeletplugin.state.ledger import Ledger, held_instances
from dradriver.kubeletplugin.state.name_book import NameBook
from dradriver.kubeletplugin.state.records import owned_partitions
from dradriver.nvml.library import Nvml
from dradriver.nvml.mig import MigCarver
from dradriver.slices.build import build
from dradriver.slices.consumable import OFF, Consumable
from fakenvml import open_backend
from tests.support.local_daemons import LocalDaemons

DRIVER, NODE = "gpu.dradriver.io", "node-a"


def lose_checkpoint(state_dir: Path) -> None:
    """The checkpoint damaged beyond repair (a disk error, a hand edit)."""
    (state_dir / "checkpoint.json").write_text("{ torn")


def fake_preparer(
    tmp: Path,
    spec: str,
    read_claim: Callable[[ClaimRef], dict[str, Any]],
    *,
    boot_id: str = "boot-1",
    mode: MigMode = MigMode.DYNAMIC,
    switching: MigSwitching = MigSwitching.ON_DEMAND,
    nvml: Nvml | None = None,
    consumable: Consumable = OFF,
    mps_protocol: int = 2,
    cgroup_root: Path | None = None,
) -> tuple[Preparer, Nvml]:
    """A Preparer (and its NVML backend) over the fake node `spec` with state in `tmp`:
    what one plugin process holds. A second call with the same `tmp` is a restart; with
    the first call's `nvml` as well, it is a second plugin instance beside the first (a
    rolling update): its own open files, hence locks, over the same GPUs. `cgroup_root`:
    shares' memory is set as pod cgroup limits there (as --cgroup-root), probed first."""
    if nvml is None:
        nvml = open_backend(spec, NODE, tmp)
        nvml.init()
    store = CheckpointStore(tmp / "checkpoint.json", boot_id)
    # Discovered once, as the plugin does at start (and then on a period, never per call).
    inv = nvml.discover().inventory
    ledger = Ledger.of(tmp)
    owned = owned_partitions(store.load())
    known = build(
        inv,
        mode,
        owned,
        switching=switching,
        held_mig=held_instances(ledger, owned),
        consumable=consumable,
    ).offer.devices()

    def devices() -> dict[str, NodeDevice]:
        return known

    # As the plugin does after each discovery: the names it publishes, and which GPU each is.
    names = NameBook(tmp / "device-names.json")
    names.learn(inv.gpus)

    daemons = LocalDaemons(tmp)
    sharing = SharingSteps(nvml.module, nvml.host, daemons, tmp / "mps", ledger)
    executor = Executor(
        driver=DRIVER,
        cdi_writer=CdiWriter(tmp / "cdi", DRIVER),
        host=nvml.host,
        profiles=lambda: {
            d.gpu.uuid: [p.profile_id for p in d.gpu.mig_profiles]
            for d in known.values()
            if d.gpu.mig_profiles
        },
        # As main.py wires it: MIG carving and mode switching in dynamic mode only.
        mig=MigPreparer(MigCarver(nvml.module), ledger, switching)
        if mode is MigMode.DYNAMIC
        else None,
        sharing=sharing,
        shares=ShareSteps(
            nvml.module, nvml.host, daemons, tmp / "mps", ledger, protocol=lambda: mps_protocol
        ),
    )
    if cgroup_root is not None:
        executor.pod_memory = PodMemory(nvml.module, cgroup_root)
        executor.pod_memory.probe(next((g.uuid for g in inv.gpus), None))
    preparer = Preparer(
        driver=DRIVER,
        node=NODE,
        kube=None,
        store=store,
        executor=executor,
        lock=FileLock(tmp / "plugin.lock"),  # as main.py names it
        devices=devices,
        metrics=Metrics(),
        read_claim=read_claim,
        consumable=consumable,
        name_book=names.snapshot,
    )
    return preparer, nvml


def allocated_claim(
    name: str, device: str, *, sharing: dict[str, Any] | None = None, share: bool = False
) -> dict[str, Any]:
    """A claim in namespace "team" allocated `device` of this node's pool, reserved for a
    pod, as prepare reads it from the API server; `sharing`: a GpuConfig's sharing for
    it, `share`: allocated as a share of 10Gi of the device's memory."""
    result: dict[str, Any] = {"request": "r", "driver": DRIVER, "pool": NODE, "device": device}
    if share:
        result.update(shareID=str(uuidlib.uuid4()), consumedCapacity={"memory": "10Gi"})
    devices: dict[str, Any] = {"results": [result]}
    if sharing is not None:
        params = {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": sharing}
        opaque = {"driver": DRIVER, "parameters": params}
        devices["config"] = [{"source": "FromClaim", "requests": ["r"], "opaque": opaque}]
    return {
        "metadata": {"uid": str(uuidlib.uuid4()), "namespace": "team", "name": name},
        "status": {
            "allocation": {"devices": devices},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "x"}],
        },
    }

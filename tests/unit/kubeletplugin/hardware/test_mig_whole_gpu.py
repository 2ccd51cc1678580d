"""A whole GPU is never handed out while in MIG mode (dynamic MIG mode): the driver
switches MIG off for the claim where it may and no MIG device is there, and back on
after; where it may not, the GPU is not offered whole and a claim for it fails naming it."""

from __future__ import annotations

import uuid as uuidlib
from pathlib import Path
from typing import Any

from dradriver.inventory.node_devices import MigSwitching
from dradriver.kubeletplugin.prepare.plan import ClaimRef
from tests.support.gpu_names import names_of, real
from tests.support.node import DRIVER, NODE, fake_preparer, lose_checkpoint


def claim(claims: dict[str, Any], name: str, device: str, gpus: list[str]) -> ClaimRef:
    """A claim allocated `device`, written by NVML index, on the node whose GPUs are
    named `gpus` (by index)."""
    device = real(device, gpus)
    uid = str(uuidlib.uuid4())
    claims[name] = {
        "metadata": {"uid": uid, "namespace": "team", "name": name},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "r", "driver": DRIVER, "pool": NODE, "device": device}]
                }
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "x"}],
        },
    }
    return ClaimRef("team", uid, name)


def ledger(tmp: Path) -> dict[str, Any]:
    import json

    return dict(json.loads((tmp / "ledger.json").read_text()))


def test_mig_mode_is_switched_off_for_the_claim_and_back_on_after(tmp_path: Path) -> None:
    claims: dict[str, Any] = {}
    prep, nvml = fake_preparer(tmp_path, "2xH100-80GB:mig=on", lambda r: claims[r.name])
    gpus = names_of(prep.devices())
    assert gpus[0] in prep.devices()  # offered whole: it can be switched for the claim
    gpu0 = nvml.backend.machine.gpus[0]
    ref = claim(claims, "whole", "gpu-0", gpus)
    result = prep.prepare([ref])[ref.uid]
    assert result.error == ""
    assert not gpu0.mig_enabled  # the container gets a GPU, not an empty MIG shell
    assert ledger(tmp_path)["migDisabled"] == {gpu0.uuid: ref.uid}  # ours to restore
    assert prep.unprepare([ref]) == {ref.uid: ""}
    assert gpu0.mig_enabled  # the admin's mode, back
    assert ledger(tmp_path)["migDisabled"] == {}


def test_never_switching_offers_no_whole_gpu_in_mig_mode_and_refuses_one(tmp_path: Path) -> None:
    claims: dict[str, Any] = {}
    prep, nvml = fake_preparer(
        tmp_path,
        "1xH100-80GB:mig=on+1xH100-80GB",
        lambda r: claims[r.name],
        switching=MigSwitching.NEVER,
    )
    offered = prep.devices()
    gpus = names_of(offered)
    # MIG on: parts only; MIG off: whole only.
    assert gpus[0] not in offered and real("gpu-0-mig-1g10gb-0", gpus) in offered
    assert gpus[1] in offered and real("gpu-1-mig-1g10gb-0", gpus) not in offered
    # Allocated against an older publication (or by hand): refused, naming the GPU.
    gpu0 = nvml.backend.machine.gpus[0]
    prep.devices = lambda: {
        **offered,
        gpus[0]: __import__("dataclasses").replace(
            offered[gpus[1]],
            name=gpus[0],
            gpu=next(d.gpu for d in offered.values() if d.gpu.uuid == gpu0.uuid),
        ),
    }  # type: ignore[method-assign]
    ref = claim(claims, "whole", "gpu-0", gpus)
    error = prep.prepare([ref])[ref.uid].error
    assert f"GPU {gpu0.uuid} ({gpus[0]}) is in MIG mode and --mig-mode-switching=never" in error
    assert gpu0.mig_enabled and prep.store.load().claims == {}


def test_a_switch_refused_because_the_gpu_is_held_names_the_holder(tmp_path: Path) -> None:
    claims: dict[str, Any] = {}
    prep, nvml = fake_preparer(tmp_path, "1xH100-80GB", lambda r: claims[r.name])
    fake = nvml.backend
    fake.faults.fail_nth("nvmlDeviceSetMigMode", 1, fake.pynvml.NVML_ERROR_IN_USE)
    ref = claim(claims, "part", "gpu-0-mig-1g10gb-0", names_of(prep.devices()))
    error = prep.prepare([ref])[ref.uid].error
    assert "MIG layer:" in error and "in use by" in error
    assert "DCGM" in error and "--mig-mode-switching=never" in error
    assert not fake.machine.gpus[0].mig_enabled and prep.store.load().claims == {}


def test_a_lost_checkpoint_keeps_mig_off_under_a_running_whole_gpu_claim(tmp_path: Path) -> None:
    """MIG mode switched off for a whole-GPU claim, then the checkpoint lost: startup
    does not switch it back on under the claim's pod (the ledger says for which claim it
    is off, and its CDI spec is still there); the claim's unprepare does."""
    claims: dict[str, Any] = {}
    prep, _nvml = fake_preparer(tmp_path, "1xH100-80GB:mig=on", lambda r: claims[r.name])
    ref = claim(claims, "whole", "gpu-0", names_of(prep.devices()))
    assert prep.prepare([ref])[ref.uid].error == ""
    lose_checkpoint(tmp_path)
    restarted, nvml2 = fake_preparer(tmp_path, "1xH100-80GB:mig=on", lambda r: claims[r.name])
    restarted.reconcile()
    gpu0 = nvml2.backend.machine.gpus[0]
    assert not gpu0.mig_enabled
    assert ledger(tmp_path)["migDisabled"] == {gpu0.uuid: ref.uid}
    assert restarted.unprepare([ref]) == {ref.uid: ""}
    assert gpu0.mig_enabled
    assert ledger(tmp_path)["migDisabled"] == {}

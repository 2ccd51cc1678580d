"""Per-claim CDI specs: their content, the lowest cdiVersion they need, and proof that a
container runtime accepts and resolves them (the CDI reference library containerd and
CRI-O use, through tools/cdi); then the spec directory: atomic writes, traversal, full disks."""

from __future__ import annotations

import copy
import errno
import json
import os
import shutil
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from dradriver.errors import CdiError
from dradriver.kubeletplugin.prepare.cdi import (
    CDI_VERSIONS,
    CdiDevice,
    CdiWriteError,
    CdiWriter,
    cdi_version_for,
    claim_spec,
    qualified_name,
)
from dradriver.nvml.host import DeviceNode, RealHost
from tests.support.cdi_reference import CDIError, ReferenceResolver, reference_resolver

DRIVER = "gpu.dradriver.io"
UID = "0f3c9a52-7b1d-4c8e-9a6f-2d4b8c1e5f70"
UID2 = "1a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d"
GPU0 = "GPU-11111111-1111-1111-1111-111111111111"
GPU1 = "GPU-22222222-2222-2222-2222-222222222222"
MIG = "MIG-33333333-3333-3333-3333-333333333333"
CAPS = ("/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22")
# A MIG device's nodes where the host's majors are unknown: paths alone.
MIG_NODES = tuple(DeviceNode(p) for p in ("/dev/nvidia0", *CAPS))


@pytest.fixture
def resolver() -> ReferenceResolver:
    return reference_resolver()


@pytest.fixture
def cdi_dir(tmp_path: Path) -> Path:
    return tmp_path / "cdi"


def two_gpus(**kw: Any) -> list[CdiDevice]:
    """Two GPUs as the fake host offers them: no device nodes."""
    return [CdiDevice("gpu-0", GPU0, **kw), CdiDevice("gpu-1", GPU1, **kw)]


def nodes(
    minor: int, mig: tuple[int, int] | None = None, proc: Path | None = None
) -> tuple[DeviceNode, ...]:
    """A real node's device nodes for a GPU (or a MIG device of it), as RealHost names them."""
    return tuple(RealHost(proc or Path("/nonexistent")).device_nodes(minor, mig))


def spec_for(devices: list[CdiDevice], uid: str = UID) -> dict[str, Any]:
    """With device nodes, as on a real node: the control nodes come too."""
    control = RealHost().control_device_nodes() if any(d.device_nodes for d in devices) else []
    return claim_spec(DRIVER, uid, devices, claim_name="team-a/train", control_nodes=control)


def env_of(edits_env: tuple[str, ...]) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in edits_env)


# -- content ---------------------------------------------------------------------------------


def test_spec_without_device_nodes_is_env_only() -> None:
    assert spec_for(two_gpus()) == {
        "cdiVersion": "0.3.0",
        "kind": "gpu.dradriver.io/claim",
        "devices": [
            {
                "name": f"gpu-0-{UID}",
                "containerEdits": {
                    "env": [
                        f"NVIDIA_VISIBLE_DEVICES={GPU0}",
                        f"CUDA_VISIBLE_DEVICES={GPU0}",
                        f"DRADRIVER_DEVICE_GPU_0={GPU0}",
                    ]
                },
            },
            {
                "name": f"gpu-1-{UID}",
                "containerEdits": {
                    "env": [
                        f"NVIDIA_VISIBLE_DEVICES={GPU0},{GPU1}",
                        f"CUDA_VISIBLE_DEVICES={GPU0},{GPU1}",
                        f"DRADRIVER_DEVICE_GPU_1={GPU1}",
                    ]
                },
            },
        ],
        "containerEdits": {
            "env": ["DRADRIVER_CLAIM=team-a/train", f"DRADRIVER_CLAIM_UID={UID}"],
        },
    }


def test_real_spec_names_device_nodes_by_path_only() -> None:
    devices = [
        CdiDevice("gpu-3", GPU0, nodes(3)),
        CdiDevice("gpu-0-mig-1g10gb-0", MIG, MIG_NODES, env=["X=1"]),
    ]
    spec = spec_for(devices)
    assert spec["cdiVersion"] == "0.3.0"
    gpu, mig = spec["devices"]
    assert gpu["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia3"}]
    assert mig["name"] == f"gpu-0-mig-1g10gb-0-{UID}"
    assert mig["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0"},
        {"path": CAPS[0]},
        {"path": CAPS[1]},
    ]
    assert mig["containerEdits"]["env"] == [
        f"NVIDIA_VISIBLE_DEVICES={GPU0},{MIG}",
        f"DRADRIVER_DEVICE_GPU_0_MIG_1G10GB_0={MIG}",
        "X=1",
    ]
    assert spec["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidiactl"},
        {"path": "/dev/nvidia-uvm"},
        {"path": "/dev/nvidia-uvm-tools"},
    ]
    # Device nodes bound what CUDA sees on real hardware; see claim_spec.
    assert not any(
        kv.startswith("CUDA_VISIBLE_DEVICES=")
        for d in spec["devices"]
        for kv in d["containerEdits"]["env"]
    )


def test_names() -> None:
    assert qualified_name(DRIVER, "gpu-0", UID) == f"gpu.dradriver.io/claim=gpu-0-{UID}"
    spec = spec_for(two_gpus())
    ids = [f"{spec['kind']}={d['name']}" for d in spec["devices"]]
    assert ids == [qualified_name(DRIVER, "gpu-0", UID), qualified_name(DRIVER, "gpu-1", UID)]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"driver": "GPU.example.com"}, "driver name"),
        ({"driver": "1gpu.example.com"}, "driver name"),
        ({"claim_uid": "../../etc"}, "not a Kubernetes UID"),
        ({"claim_uid": "abc-"}, "not a Kubernetes UID"),
        ({"devices": []}, "no devices"),
        ({"devices": [CdiDevice("gpu-0", GPU0), CdiDevice("gpu-0", GPU1)]}, "twice"),
        ({"devices": [CdiDevice("gpu/0", GPU0)]}, "device name"),
        ({"devices": [CdiDevice("gpu-0", "")]}, "UUID"),
        ({"devices": [CdiDevice("gpu-0", "GPU-a,GPU-b")]}, "UUID"),
        ({"devices": [CdiDevice("gpu-0", GPU0, env=["=x"])]}, "KEY=VALUE"),
        ({"devices": [CdiDevice("gpu-0", GPU0, device_nodes=[DeviceNode("dev/x")])]}, "abs"),
    ],
)
def test_invalid_input_is_refused(kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {
        "driver": DRIVER,
        "claim_uid": UID,
        "devices": two_gpus(),
        "claim_name": "a/b",
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        claim_spec(**args)


def test_a_real_gpu_without_a_minor_has_no_device_node_to_name() -> None:
    with pytest.raises(ValueError, match="minor"):
        RealHost().device_nodes(None, None)


# -- what a runtime makes of them ------------------------------------------------------------


def test_env_only_spec_resolves_with_all_uuids(resolver: ReferenceResolver, cdi_dir: Path) -> None:
    writer = CdiWriter(cdi_dir, DRIVER)
    writer.write(UID, spec_for(two_gpus()))
    assert resolver.validate([cdi_dir]) == []
    both = resolver.resolve(
        [cdi_dir], [qualified_name(DRIVER, "gpu-0", UID), qualified_name(DRIVER, "gpu-1", UID)]
    )
    env = env_of(both.env)
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{GPU0},{GPU1}"
    assert env["CUDA_VISIBLE_DEVICES"] == f"{GPU0},{GPU1}"
    assert env["DRADRIVER_DEVICE_GPU_0"] == GPU0
    assert env["DRADRIVER_DEVICE_GPU_1"] == GPU1
    assert env["DRADRIVER_CLAIM"] == "team-a/train"
    assert env["DRADRIVER_CLAIM_UID"] == UID
    assert both.device_nodes == ()
    one = env_of(resolver.resolve([cdi_dir], [qualified_name(DRIVER, "gpu-0", UID)]).env)
    assert one["NVIDIA_VISIBLE_DEVICES"] == GPU0
    assert "DRADRIVER_DEVICE_GPU_1" not in one


def test_groups_keep_requests_apart(resolver: ReferenceResolver, cdi_dir: Path) -> None:
    # Two requests of one claim, each handed to its own container.
    devices = [
        CdiDevice("gpu-0", GPU0, group="trainer"),
        CdiDevice("gpu-1", GPU1, group="evaluator"),
        CdiDevice("gpu-0-mig-1g10gb-0", MIG, group="evaluator"),
    ]
    CdiWriter(cdi_dir, DRIVER).write(UID, spec_for(devices))
    trainer = resolver.resolve([cdi_dir], [qualified_name(DRIVER, "gpu-0", UID)])
    evaluator = resolver.resolve(
        [cdi_dir],
        [
            qualified_name(DRIVER, "gpu-1", UID),
            qualified_name(DRIVER, "gpu-0-mig-1g10gb-0", UID),
        ],
    )
    assert env_of(trainer.env)["NVIDIA_VISIBLE_DEVICES"] == GPU0
    assert env_of(evaluator.env)["CUDA_VISIBLE_DEVICES"] == f"{GPU1},{MIG}"


def test_specs_of_many_claims_coexist(resolver: ReferenceResolver, cdi_dir: Path) -> None:
    writer = CdiWriter(cdi_dir, DRIVER)
    writer.write(UID, spec_for([CdiDevice("gpu-0", GPU0)], uid=UID))
    writer.write(UID2, spec_for([CdiDevice("gpu-1", GPU1)], uid=UID2))
    assert resolver.validate([cdi_dir]) == []
    edits = resolver.resolve(
        [cdi_dir], [qualified_name(DRIVER, "gpu-0", UID), qualified_name(DRIVER, "gpu-1", UID2)]
    )
    env = env_of(edits.env)
    # A container with two claims: the per-device variables name every GPU it got.
    assert (env["DRADRIVER_DEVICE_GPU_0"], env["DRADRIVER_DEVICE_GPU_1"]) == (GPU0, GPU1)
    assert env["DRADRIVER_CLAIM_UID"] == UID2


def test_real_spec_is_valid(resolver: ReferenceResolver, cdi_dir: Path) -> None:
    devices = [
        CdiDevice("gpu-3", GPU0, nodes(3)),
        CdiDevice("gpu-0-mig-1g10gb-0", MIG, MIG_NODES),
    ]
    CdiWriter(cdi_dir, DRIVER).write(UID, spec_for(devices))
    assert resolver.validate([cdi_dir]) == []


def test_real_spec_resolves_to_its_device_nodes(resolver: ReferenceResolver, cdi_dir: Path) -> None:
    # No GPU here, so the runtime fails exactly on the host device it cannot stat.
    CdiWriter(cdi_dir, DRIVER).write(UID, spec_for([CdiDevice("gpu-5", GPU0, nodes(5))]))
    if os.path.exists("/dev/nvidia5"):
        pytest.skip("this machine has /dev/nvidia5")
    with pytest.raises(CDIError, match="/dev/nvidia"):
        resolver.resolve([cdi_dir], [qualified_name(DRIVER, "gpu-5", UID)])


# -- versions --------------------------------------------------------------------------------


def _bump(spec: dict[str, Any], feature: str) -> dict[str, Any]:
    s = copy.deepcopy(spec)
    for d in s["devices"]:
        _bump_edits(d["containerEdits"], feature)
    if feature == "digit name":
        s["devices"][0]["name"] = "0-" + s["devices"][0]["name"]
    elif feature == "annotations":
        s["annotations"] = {"a": "b"}
    elif feature == "device annotations":
        s["devices"][0]["annotations"] = {"a": "b"}
    elif feature == "dotted class":
        s["kind"] = "gpu.dradriver.io/claim.v2"
    return s


def _bump_edits(dev: dict[str, Any], feature: str) -> None:
    # On every device: specs-go v1.1.1 (built as Go 1.19, loop variables shared) checks
    # mount types and hostPaths of the last device only, so a feature on the first alone
    # would pass the reference at a lower version; cdi_version_for checks them all.
    if feature == "mount type":
        dev["mounts"] = [{"hostPath": "/tmp", "containerPath": "/x", "type": "bind"}]
    elif feature == "plain mount":
        dev["mounts"] = [{"hostPath": "/tmp", "containerPath": "/x"}]
    elif feature == "hostPath":
        dev["deviceNodes"] = [{"path": "/dev/x", "hostPath": "/dev/null"}]
    elif feature == "additionalGids":
        dev["additionalGids"] = [44]
    elif feature == "intelRdt":
        dev["intelRdt"] = {"closID": "gpu"}
    elif feature == "intelRdt schemata":
        dev["intelRdt"] = {"closID": "gpu", "schemata": ["L3:0=f"]}
    elif feature == "netDevices":
        dev["netDevices"] = [{"hostInterfaceName": "eth1", "name": "net1"}]


FEATURES = {
    "none": "0.3.0",
    "plain mount": "0.3.0",
    "mount type": "0.4.0",
    "hostPath": "0.5.0",
    "digit name": "0.5.0",
    "annotations": "0.6.0",
    "device annotations": "0.6.0",
    "dotted class": "0.6.0",
    "additionalGids": "0.7.0",
    "intelRdt": "0.7.0",
    "intelRdt schemata": "1.1.0",
    "netDevices": "1.1.0",
}


@pytest.mark.parametrize(("feature", "expected"), FEATURES.items(), ids=FEATURES.keys())
def test_version_is_the_lowest_the_library_accepts(
    resolver: ReferenceResolver, tmp_path: Path, feature: str, expected: str
) -> None:
    spec = _bump(spec_for(two_gpus()), feature)
    assert cdi_version_for(spec) == expected
    ok, low = tmp_path / "ok", tmp_path / "low"
    ok.mkdir()
    low.mkdir()
    (ok / "spec.json").write_text(json.dumps({**spec, "cdiVersion": expected}))
    assert resolver.validate([ok]) == []
    index = CDI_VERSIONS.index(expected)
    if index > 0:
        (low / "spec.json").write_text(json.dumps({**spec, "cdiVersion": CDI_VERSIONS[index - 1]}))
        errors = resolver.validate([low])
        assert len(errors) == 1 and f"must be at least v{expected}" in errors[0]


def test_version_counts_features_of_every_device() -> None:
    # Stricter than specs-go v1.1.1 (last device only), as a fixed library would be.
    spec = spec_for(two_gpus())
    first = spec["devices"][0]["containerEdits"]
    first["mounts"] = [{"hostPath": "/tmp", "containerPath": "/x", "type": "bind"}]
    assert cdi_version_for(spec) == "0.4.0"
    first["deviceNodes"] = [{"path": "/dev/x", "hostPath": "/dev/null"}]
    assert cdi_version_for(spec) == "0.5.0"
    spec["containerEdits"]["additionalGids"] = [44]
    assert cdi_version_for(spec) == "0.7.0"


# -- the spec directory ----------------------------------------------------------------------


def test_write_is_atomic_and_readable(cdi_dir: Path) -> None:
    writer = CdiWriter(cdi_dir, DRIVER)
    assert not cdi_dir.exists()
    spec = spec_for(two_gpus())
    writer.write(UID, spec)
    path = writer.spec_path(UID)
    assert path == cdi_dir / f"gpu.dradriver.io-claim-{UID}.json"
    assert json.loads(path.read_text()) == spec
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert writer.exists(UID) and not writer.exists(UID2)
    # Rewriting (after a reboot wiped /var/run/cdi, or on a repeated prepare) replaces it.
    newer = spec_for([CdiDevice("gpu-1", GPU1)])
    writer.write(UID, newer)
    assert json.loads(path.read_text()) == newer
    assert sorted(p.name for p in cdi_dir.iterdir()) == [path.name]


def test_a_spec_directory_removed_meanwhile_is_made_again(cdi_dir: Path) -> None:
    writer = CdiWriter(cdi_dir, DRIVER)
    writer.write(UID, spec_for(two_gpus()))
    shutil.rmtree(cdi_dir)  # /var/run/cdi is a tmpfs an admin may clear
    writer.write(UID2, spec_for(two_gpus()))
    path = writer.spec_path(UID2)
    assert path.parent == cdi_dir and json.loads(path.read_text())["devices"]


def test_a_temp_file_a_dead_writer_left_is_written_over(cdi_dir: Path) -> None:
    """Temp files are named for the writing process and thread (no random name): one a
    crashed process of the same pid left must not stop the write, nor be followed if a
    link."""
    writer = CdiWriter(cdi_dir, DRIVER)
    writer.write(UID, spec_for(two_gpus()))
    path = writer.spec_path(UID)
    tmp = cdi_dir / f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp"
    elsewhere = cdi_dir.parent / "not-a-spec"
    elsewhere.write_text("keep")
    tmp.symlink_to(elsewhere)
    with pytest.raises(CdiWriteError):
        writer.write(UID, spec_for([CdiDevice("gpu-1", GPU1)]))
    assert elsewhere.read_text() == "keep"
    tmp.unlink()
    tmp.write_text("half a spec from a crash")
    newer = spec_for([CdiDevice("gpu-1", GPU1)])
    writer.write(UID, newer)
    assert json.loads(path.read_text()) == newer
    assert sorted(p.name for p in cdi_dir.iterdir()) == [path.name]


@pytest.mark.parametrize(
    "uid", ["../evil", "a/b", "..", ".", "", "/etc/passwd", "x\x00y", "a b", "-a", "a..b"]
)
def test_uids_cannot_escape_the_spec_dir(tmp_path: Path, uid: str) -> None:
    cdi_dir = tmp_path / "cdi"
    writer = CdiWriter(cdi_dir, DRIVER)
    spec = spec_for(two_gpus())
    for call in (
        lambda: writer.spec_path(uid),
        lambda: writer.write(uid, spec),
        lambda: writer.exists(uid),
        lambda: writer.remove(uid),
    ):
        with pytest.raises(ValueError, match="not a Kubernetes UID"):
            call()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_bad_driver_name_is_refused(cdi_dir: Path) -> None:
    with pytest.raises(ValueError, match="driver name"):
        CdiWriter(cdi_dir, "../gpu.dradriver.io")


def test_full_disk_is_a_clear_error_with_no_temp_left(
    cdi_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = CdiWriter(cdi_dir, DRIVER)
    old = spec_for([CdiDevice("gpu-0", GPU0)])
    writer.write(UID, old)

    def full(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(CdiWriteError) as info:
        writer.write(UID, spec_for(two_gpus()))
    with pytest.raises(OSError):
        writer.write(UID2, old)
    monkeypatch.undo()
    err = info.value
    assert err.errno == errno.ENOSPC
    assert isinstance(err, CdiError) and err.layer == "CDI"
    message = str(err)
    assert message.startswith("CDI layer: ")
    assert str(writer.spec_path(UID)) in message
    assert "No space left on device" in message and "is full" in message
    assert sorted(p.name for p in cdi_dir.iterdir()) == [writer.spec_path(UID).name]
    assert json.loads(writer.spec_path(UID).read_text()) == old


def test_unwritable_dir_is_a_cdi_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(CdiWriteError, match="CDI layer: cannot write the spec"):
        CdiWriter(blocker / "cdi", DRIVER).write(UID, spec_for(two_gpus()))


def test_remove_is_idempotent(cdi_dir: Path) -> None:
    writer = CdiWriter(cdi_dir, DRIVER)
    assert writer.remove(UID) is False  # no directory at all
    writer.write(UID, spec_for(two_gpus()))
    assert writer.remove(UID) is True
    assert writer.remove(UID) is False
    assert not writer.exists(UID)


def test_list_claims_finds_only_our_specs(cdi_dir: Path) -> None:
    writer = CdiWriter(cdi_dir, DRIVER)
    assert writer.list_claims() == []
    writer.write(UID2, spec_for(two_gpus(), uid=UID2))
    writer.write(UID, spec_for(two_gpus()))
    for foreign in (
        f"other.example.com-claim-{UID}.json",  # another driver
        f"gpu.dradriver.io-claim-{UID}.yaml",  # not written by us
        f".gpu.dradriver.io-claim-{UID}.json.abc123.tmp",  # a crashed write
        "gpu.dradriver.io-claim-not_a_uid.json",
        "nvidia.json",
    ):
        (cdi_dir / foreign).write_text("{}")
    assert writer.list_claims() == [UID, UID2]
    assert CdiWriter(cdi_dir, "other.example.com").list_claims() == [UID]

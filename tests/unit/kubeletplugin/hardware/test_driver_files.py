"""The driver's files in a container, as NVIDIA's container toolkit computes them
(tools/nvcdi's dradriver-nvcdi over the toolkit's nvcdi package), over a fake driver root
laid out as NVIDIA's installer lays one out (fakenvml/driver_root.py), then resolved by the
CDI reference library as containerd resolves a claim's devices."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dradriver.kubeletplugin.hardware.driver_files import DriverFiles, DriverFilesError
from dradriver.kubeletplugin.prepare.cdi import (
    CdiDevice,
    CdiWriter,
    claim_spec,
    driver_device_id,
    driver_spec,
    qualified_name,
)
from fakenvml.driver_root import lay_out
from tests.support.cdi_reference import reference_resolver

REPO = Path(__file__).resolve().parents[4]
D = "gpu.dradriver.io"
V = "570.86.15"
HOOK = "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
HOST = Path("/run/nvidia/driver")
UID = "0b0c4ee5-5c7d-4d1e-9d26-8d2a6c1c54f1"


@pytest.fixture(scope="module")
def helper() -> str:
    proc = subprocess.run(
        ["bash", str(REPO / "tools" / "nvcdi" / "build.sh")], stdout=subprocess.PIPE, text=True
    )
    if proc.returncode == 127:
        pytest.skip("go is not installed, so tools/nvcdi cannot be built")
    assert proc.returncode == 0, "tools/nvcdi/build.sh failed (its output is above)"
    return str(Path(proc.stdout.strip().splitlines()[-1]) / "dradriver-nvcdi")


def files(tmp_path: Path, helper: str) -> DriverFiles:
    return DriverFiles(tmp_path / "driver-root", HOST, HOOK, helper=helper)


def test_the_toolkit_finds_the_drivers_files_under_the_root(tmp_path: Path, helper: str) -> None:
    lay_out(tmp_path / "driver-root", V)
    edits = files(tmp_path, helper).edits(V)
    mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    lib = "/usr/lib/x86_64-linux-gnu"
    for path in (
        f"{lib}/libcuda.so.{V}",
        f"{lib}/libnvidia-ml.so.{V}",
        "/usr/bin/nvidia-smi",
        f"/lib/firmware/nvidia/{V}/gsp_ga10x.bin",
    ):
        # Host paths as the host sees the driver root, not as the plugin sees it.
        assert mounts[path] == f"{HOST}{path}", path
    hooks = [h["args"][1] for h in edits["hooks"]]
    assert {"create-symlinks", "update-ldcache"} <= set(hooks)
    assert {h["path"] for h in edits["hooks"]} == {HOOK}
    # The SONAME links the toolkit read from each library (libcuda.so -> libcuda.so.1).
    links = [a for h in edits["hooks"] for a in h["args"] if "::" in a]
    assert f"libcuda.so.1::{lib}/libcuda.so" in links


def test_a_driver_upgraded_under_the_plugin_is_asked_again(tmp_path: Path, helper: str) -> None:
    root = tmp_path / "driver-root"
    lay_out(root, V)
    df = files(tmp_path, helper)
    first = df.edits(V)
    assert df.edits(V) is first  # once per version
    lay_out(root, "580.65.06")  # the new driver beside the old, before its removal
    newer = {m["containerPath"] for m in df.edits("580.65.06")["mounts"]}
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06" in newer
    assert not any(V in p for p in newer)  # the version asked for, never a guess


def test_no_driver_under_the_root_names_the_root_and_its_value(tmp_path: Path, helper: str) -> None:
    (tmp_path / "driver-root").mkdir()
    with pytest.raises(DriverFilesError, match=r"no driver 570\.86\.15 under .*driver-root") as e:
        files(tmp_path, helper).edits(V)
    assert "Helm driverRoot" in str(e.value)
    missing = DriverFiles(tmp_path, HOST, HOOK, helper="no-such-dradriver-nvcdi")
    with pytest.raises(DriverFilesError, match="is not installed"):
        missing.edits(V)


def test_the_runtime_gives_a_container_the_drivers_files_once(tmp_path: Path, helper: str) -> None:
    """Two claims' GPUs in one container, each device naming the node's driver spec too:
    the CDI reference library applies the driver's files once and each claim's GPUs as
    before; the toolkit's NVIDIA_VISIBLE_DEVICES=void never hides them."""
    lay_out(tmp_path / "driver-root", V)
    specs = tmp_path / "cdi"
    writer = CdiWriter(specs, D)
    writer.write_driver(driver_spec(D, V, files(tmp_path, helper).edits(V)))
    other = "7d0b3a1e-2f5c-4a6b-8e9d-1c2b3a4d5e6f"
    for uid, dev in ((UID, "gpu-9b3c2810"), (other, "gpu-1f2e3d4c")):
        spec = claim_spec(D, uid, [CdiDevice(dev, f"GPU-{dev}")], claim_name=f"ns/{dev}")
        writer.write(uid, spec)
    resolver = reference_resolver()
    assert resolver.validate([specs]) == []
    ids = [
        qualified_name(D, "gpu-9b3c2810", UID),
        driver_device_id(D),
        qualified_name(D, "gpu-1f2e3d4c", other),
        driver_device_id(D),
    ]
    got = resolver.resolve([specs], ids)
    smi = [m for m in got.mounts if m["containerPath"] == "/usr/bin/nvidia-smi"]
    assert [m["hostPath"] for m in smi] == [f"{HOST}/usr/bin/nvidia-smi"]
    assert sum(1 for h in got.hooks if "update-ldcache" in h["args"]) == 1
    env = dict(e.split("=", 1) for e in got.env)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-gpu-1f2e3d4c"  # the last claim's, never void
    assert env["DRADRIVER_DRIVER_VERSION"] == V


def test_the_driver_spec_is_valid_json_a_runtime_reads(tmp_path: Path) -> None:
    writer = CdiWriter(tmp_path, D)
    writer.write_driver(driver_spec(D, V, {"env": ["NVIDIA_VISIBLE_DEVICES=void"], "mounts": []}))
    stored = json.loads(writer.driver_spec_path.read_text())
    assert stored["kind"] == f"{D}/driver"
    assert stored["containerEdits"] == {}  # void left out, nothing else given
    assert writer.remove_driver() and not writer.remove_driver()
    with pytest.raises(ValueError, match="not one"):
        driver_spec(D, "", {})

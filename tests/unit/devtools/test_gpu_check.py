"""make gpu-check's comparisons, kept working without a GPU: discovery of a fake beside
its twin differs in nothing; a real GPU that differs shows each attribute, not a shifted
list; the driver spec beside nvidia-ctk's names what only one side has; nvidia-smi runs
from the spec's own paths."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import pytest

from dradriver_dev import gpu_check
from dradriver_dev.driver_files import fake_driver_root

REPO = Path(__file__).resolve().parents[3]


def test_a_fake_matches_its_twin_and_a_difference_is_named() -> None:
    real = gpu_check.devices_json("fake:1xH200-141GB")["inventory"]["gpus"]
    twins = gpu_check.fake_twin(real)
    (gpu,) = real
    assert gpu_check.compare_gpu(gpu, twins[gpu["name"]]) == []
    other = copy.deepcopy(gpu)
    other["uuid"] = "GPU-00000000-0000-0000-0000-000000000000"  # identity: never a difference
    other["memoryBytes"] += 1
    other["migProfiles"] = [p for p in other["migProfiles"] if p["name"] != "1g.18gb"]
    other["migProfiles"][0]["placements"] = [0]
    diffs = {d.path: (d.real, d.fake) for d in gpu_check.compare_gpu(other, twins[gpu["name"]])}
    assert diffs["memoryBytes"] == (gpu["memoryBytes"] + 1, gpu["memoryBytes"])
    assert diffs["migProfiles[1g.18gb].instanceCount"] == (None, 7)
    first = gpu["migProfiles"][1]["name"]
    assert diffs[f"migProfiles[{first}].placements"][0] == [0]
    assert not any(p.startswith("uuid") for p in diffs)


def test_the_spec_beside_the_toolkits_and_nvidia_smi_through_it() -> None:
    proc = subprocess.run(
        ["bash", str(REPO / "tools" / "nvcdi" / "build.sh")], stdout=subprocess.PIPE, text=True
    )
    if proc.returncode == 127:
        pytest.skip("go is not installed, so tools/nvcdi cannot be built")
    tools = Path(proc.stdout.strip().splitlines()[-1])
    root = fake_driver_root()
    ours, err = gpu_check.driver_files(tools, str(root), "570.86.15")
    assert ours["mounts"], err
    lib = "/usr/lib/x86_64-linux-gnu/libcuda.so.570.86.15"
    theirs = {
        "containerEdits": {"mounts": [{"containerPath": lib, "hostPath": lib}]},
        "devices": [{"containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}],
    }
    diff = gpu_check.compare_edits(ours, theirs)
    assert diff["deviceNodes only in nvidia-ctk"] == ["/dev/nvidia0"]
    assert lib not in diff["mounts only in dradriver"]
    assert "/usr/bin/nvidia-smi" in diff["mounts only in dradriver"]
    code, said = gpu_check.smi_through(ours)
    assert code == 0 and said.startswith("nvidia-smi 570.86.15"), said

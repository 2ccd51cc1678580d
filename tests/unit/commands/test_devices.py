"""`dradriver devices` as a newcomer reads it: the GPUs, the MIG profile names a claim
selects by (with what each instance gets, in human units), and the slices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from dradriver.cli import main
from tests.support.gpu_names import fake_names


def test_the_table_lists_each_products_mig_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--devices", "fake:2xH100-80GB+1xL4"]) == 0
    out = capsys.readouterr().out
    # Once per product, not per GPU; none for the L4, which has no MIG.
    assert out.count("MIG profiles of NVIDIA H100 80GB HBM3 (GPU 0 and alike):") == 1
    assert "MIG profiles of NVIDIA L4" not in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("  ")}
    assert rows["1g.10gb"][1:3] == ["9.8", "GiB"]
    assert rows["1g.10gb+me"][-3:] == ["1", "0,1,2,3,4,5,6", "1"]  # the one OFA; once per GPU
    assert rows["3g.40gb"][-2:] == ["0,4", "2"]
    assert rows["7g.80gb"][3] == "132"  # SMs


def test_the_table_gives_sizes_in_binary_units(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--devices", "fake:1xH100-80GB+1xA100-40GB"]) == 0
    out = capsys.readouterr().out
    gpus = {line.split()[0]: line for line in out.splitlines() if line[:1].isdigit()}
    assert "  79.6 GiB  " in gpus["0"]  # 81559 MiB, as nvidia-smi reports an H100 80GB
    assert "  40 GiB  " in gpus["1"]  # exactly 40 GiB: no ".0"
    assert "85520809984" not in out and "42949672960" not in out  # no raw byte counts


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (80 * 2**30, "80 GiB"),
        (85520809984, "79.6 GiB"),
        (2**40 - 2**20, "1 TiB"),  # rounds up to the next unit, never "1024 GiB"
    ],
)
def test_human_bytes(n: int, text: str) -> None:
    from dradriver.commands.devices import human_bytes

    assert human_bytes(n) == text


def _keys(value: object, where: str = "") -> list[str]:
    if isinstance(value, dict):
        return [f"{where}.{k}" for k in value] + [
            key for k, v in value.items() for key in _keys(v, f"{where}.{k}")
        ]
    if isinstance(value, list):
        return [key for i, v in enumerate(value) for key in _keys(v, f"{where}[{i}]")]
    return []


def test_json_and_yaml_are_the_same_document_with_camel_case_keys_and_exact_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # MIG on with a MIG device and a GPU instance without compute instances, so every
    # part of the inventory (profiles, MIG devices, idle GPU instances) has entries.
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        yaml.safe_dump(
            {
                "gpus": [
                    {
                        "product": "H100-80GB",
                        "mig": True,
                        "migDevices": [
                            {"gpu": 0, "profile": "3g.40gb", "placement": 0},
                            {
                                "gpu": 0,
                                "profile": "3g.40gb",
                                "placement": 4,
                                "computeInstances": [],
                            },
                        ],
                    },
                    {"product": "L4"},
                ]
            }
        )
    )
    docs = {}
    for fmt in ("json", "yaml"):
        argv = ["devices", "--devices", f"fake:@{fleet}", "--mig-mode", "static", "-o", fmt]
        assert main(argv) == 0
        docs[fmt] = yaml.safe_load(capsys.readouterr().out)  # JSON is YAML too
    assert docs["json"] == docs["yaml"]
    doc = docs["json"]
    snake = [k for k in _keys(doc) if "_" in k.rsplit(".", 1)[-1]]
    assert snake == []
    inv = doc["inventory"]
    assert inv["driverVersion"] and inv["cudaDriverVersion"]
    h100 = inv["gpus"][0]
    assert h100["memoryBytes"] == 85520809984  # exact bytes, not "79.6 GiB"
    assert h100["migDevices"][0]["parentUuid"] == h100["uuid"]
    assert h100["idleGpuInstances"][0]["placementStart"] == 4
    assert h100["migProfiles"][0]["instanceCount"] == 7
    # The slices are the ones published, unchanged.
    assert doc["resourceSlices"][0]["apiVersion"] == "resource.k8s.io/v1"


def test_mig_profiles_narrow_what_dynamic_mode_would_publish(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["devices", "--devices", "fake:1xH100-80GB", "--mig-mode", "dynamic", "-o", "json"]
    assert main([*args, "--mig-profiles", "3g.40gb"]) == 0
    doc = json.loads(capsys.readouterr().out)
    devices = [d for s in doc["resourceSlices"] for d in s["spec"]["devices"]]
    profiles = {d["attributes"].get("profile", {}).get("string", "whole") for d in devices}
    assert profiles == {"3g.40gb", "whole"} and len(devices) == 3


def test_devices_show_health_as_the_plugin_and_a_probe_see_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GPU the plugin found unhealthy (its health.json) and one a probe finds with a row
    remapping pending: both shown, and tainted in the slices as the plugin publishes."""
    from fakenvml import load

    fake = load("3xH100-80GB", node="n", state_dir=tmp_path)
    fake.faults.xid_error(2, 94)  # leaves a row remapping pending
    u0 = fake.machine.gpus[0].uuid
    (tmp_path / "health.json").write_text(
        json.dumps(
            {"format": 1, "gpus": {u0: {"fault": {"reason": "xid-79", "since": 1, "xid": 79}}}}
        )
    )
    base = ["devices", "--devices", "fake:3xH100-80GB", "--node-name", "n"]
    assert main([*base, "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line[:1].isdigit()}
    assert " unhealthy:xid-79 " in rows["0"]
    assert " healthy " in rows["1"]
    assert " unhealthy:row-remap-pending " in rows["2"]
    assert main([*base, "--state-dir", str(tmp_path), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["health"][u0] == {"health": "Unhealthy", "reason": "xid-79"}
    taints = {
        d["name"]: d["taints"][0]["value"]
        for s in doc["resourceSlices"]
        for d in s["spec"]["devices"]
        if d.get("taints")
    }
    gpus = fake_names("3xH100-80GB", "n")  # by NVML index
    assert taints == {gpus[0]: "xid-79", gpus[2]: "row-remap-pending"}


def test_shared_devices_show_what_the_prepared_shares_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dradriver.kubeletplugin.state.checkpoint.codec import encode_checkpoint
    from dradriver.kubeletplugin.state.records import (
        PREPARE_COMPLETED,
        Checkpoint,
        ClaimRecord,
        PreparedDevice,
        Share,
    )

    claims = {}
    gpus = fake_names("2xH100-80GB", "node-a")  # by NVML index
    for i in range(3):
        uid = f"{i}aaaaaaa-1111-2222-3333-444455556666"
        share = Share(
            f"{i}0000000-0000-4000-8000-000000000000", (("compute", "0"), ("memory", "20Gi"))
        )
        dev = PreparedDevice(["gpu"], "node-a", gpus[0], [], share=share)
        claims[uid] = ClaimRecord(uid, "team", f"c{i}", PREPARE_COMPLETED, [dev])
    (tmp_path / "checkpoint.json").write_bytes(encode_checkpoint(Checkpoint(claims=claims)))
    argv = ["devices", "--devices", "fake:2xH100-80GB", "--node-name", "node-a"]
    argv += ["--consumable-capacity", "memory"]
    assert main([*argv, "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Shared devices (--consumable-capacity memory):" in out
    assert (
        f"  {gpus[0]}: 3 shares; compute 0 of 100 (100 free), memory 60Gi of 79.6Gi (19.6Gi free)"
        in out
    )
    assert f"  {gpus[1]}: 0 shares;" in out
    # Off: no such section, and dynamic MIG with shares is refused naming both flags.
    assert main(["devices", "--devices", "fake:2xH100-80GB", "--state-dir", str(tmp_path)]) == 0
    assert "Shared devices" not in capsys.readouterr().out
    assert main([*argv, "--mig-mode", "dynamic"]) == 2
    assert "--mig-mode=dynamic" in capsys.readouterr().err


def test_counts_read_as_english(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--devices", "fake:1xL4"]) == 0
    out = capsys.readouterr().out
    assert ": 1 GPU, driver" in out
    assert "): 1 slice, 1 device" in out and "devices-0: 1 device (1 gpu)" in out
    assert main(["devices", "--devices", "fake:2xL4"]) == 0
    assert "): 1 slice, 2 devices" in capsys.readouterr().out


def test_kubernetes_names_the_line_the_slices_are_laid_out_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["devices", "--devices", "fake:8xH100-80GB", "--mig-mode", "dynamic"]
    assert main([*base, "-o", "json"]) == 0
    joint = json.loads(capsys.readouterr().out)
    assert main([*base, "--kubernetes", "1.37", "-o", "json"]) == 0
    apart = json.loads(capsys.readouterr().out)
    assert (joint["kubernetes"], apart["kubernetes"]) == ("1.34", "1.37")
    # 1.34: two slices of devices with their counter sets; 1.37: the counter sets apart.
    assert all(s["spec"].get("sharedCounters") for s in joint["resourceSlices"])
    (counters, *devices) = apart["resourceSlices"]
    assert "devices" not in counters["spec"] and len(counters["spec"]["sharedCounters"]) == 8
    assert all("sharedCounters" not in s["spec"] for s in devices)
    assert sum(len(s["spec"]["devices"]) for s in devices) == 208
    assert main([*base, "--kubernetes", "1.37"]) == 0
    out = capsys.readouterr().out
    assert "laid out for Kubernetes 1.37): 5 slices, 208 devices" in out
    assert "  counters-0: 8 counter sets, 64 shared counters" in out
    assert main([*base, "--kubernetes", "1.30"]) == 2
    assert "older than this driver supports" in capsys.readouterr().err

"""The checkpoint formats the project has written, each kept as a real file under
tests/data/checkpoint/: every one is read by this release, and the newest is byte for
byte what this release writes for the same records (a change of the format then adds a
file rather than rewriting one). docs/design.md, "The checkpoint's format"."""

from __future__ import annotations

from pathlib import Path

from dradriver.kubeletplugin.state.checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    Checkpoint,
    ClaimRecord,
    PreparedDevice,
    encode_checkpoint,
    parse_checkpoint,
)
from dradriver.kubeletplugin.state.records import (
    Carve,
    DaemonRef,
    ImexDaemon,
    MigIds,
    Mps,
    MpsLimits,
    Share,
    TimeSlicing,
)

FILES = Path(__file__).resolve().parents[5] / "tests" / "data" / "checkpoint"
NEWEST = FILES / "v1.json"
UID = "0f3c9a52-7b1d-4c8e-9a6f-2d4b8c1e5f70"
GPU = "GPU-11111111-2222-3333-4444-555555555555"


def _device(name: str, **kw: object) -> PreparedDevice:
    return PreparedDevice(
        request_names=["gpu"],
        pool="node-a",
        device=name,
        cdi_device_ids=[f"gpu.dradriver.io/claim={UID}-{name}"],
        **kw,  # type: ignore[arg-type]
    )


def every_record() -> Checkpoint:
    """One of each part a prepared device can hold, as prepares of every kind record it."""
    mps = Mps(
        MpsLimits(40, "10Gi", (("0", "5Gi"),)),
        applied=True,
        pipe_dir="/var/lib/dradriver/mps/c/pipe",
        log_dir="/var/lib/dradriver/mps/c/log",
        shm_dir="/var/lib/dradriver/mps/c/shm",
        daemon=DaemonRef("mps-c-0", "6f1b2c3d-0000-4000-8000-000000000001"),
    )
    share = Share(
        "s-1",
        (("memory", "10Gi"),),
        memory_limit=10 << 30,
        compute_limit=25,
        pipe_dir="/p",
        log_dir="/l",
        shm_dir="/s",
        applied=True,
        server_side=True,
        pods=("pod-1",),
        pod_cgroups=("/kubepods/pod-1",),
    )
    imex = ImexDaemon(
        "dom-uid",
        "domain",
        "team-a",
        0,
        address="10.0.0.1",
        peers=("10.0.0.1", "10.0.0.2"),
        config_dir="/var/lib/dradriver/imex/dom-uid",
        daemon=DaemonRef("imex-dom-uid-1", "6f1b2c3d-0000-4000-8000-000000000002"),
    )
    devices = [
        _device("gpu-a", uuid=GPU, minor=0),
        _device(
            "gpu-a-mig-1g10gb-0",
            uuid="MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
            kind="mig",
            minor=0,
            carve=Carve(GPU, 19, "1g.10gb", 0, 1, 1, 7, 0),
        ),
        _device("gpu-b-mig-1g10gb-3", kind="mig", minor=1, mig=MigIds(9, 0)),
        _device("gpu-c", uuid=GPU, minor=2, sharing=TimeSlicing("Long", applied=True)),
        _device("gpu-d", uuid=GPU, minor=3, sharing=mps),
        _device("gpu-e", uuid=GPU, minor=4, share=share),
        _device("gpu-f", uuid=GPU, minor=5, admin_access=True),
        _device("channel", kind="imex-channel", imex=imex),
    ]
    claims = [
        ClaimRecord(UID, "team-a", "every", PREPARE_COMPLETED, devices, 1_700_000_000.25),
        ClaimRecord("1a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d", "team-b", "half", PREPARE_STARTED),
    ]
    return Checkpoint(
        boot_id="6f1d2c4e-0000-4000-8000-000000000001", claims={c.uid: c for c in claims}
    )


def test_every_format_written_is_read() -> None:
    files = sorted(FILES.glob("v*.json"))
    assert NEWEST in files
    for path in files:
        cp, notes = parse_checkpoint(path.read_bytes())
        assert notes == [], path.name  # nothing unknown, nothing newer
        assert len(cp.claims) == 2, path.name


def test_the_newest_file_is_what_this_release_writes() -> None:
    """Fails when the format changed: keep the old file, add the new one as v<N>.json
    (and say in docs/design.md how the old one is read)."""
    cp, _ = parse_checkpoint(NEWEST.read_bytes())
    assert cp.claims == every_record().claims
    assert encode_checkpoint(every_record()) == NEWEST.read_bytes()

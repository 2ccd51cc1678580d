"""What an uninstall removes from the state directory, and when it keeps everything."""

from __future__ import annotations

from pathlib import Path

from dradriver.kubeletplugin.state.tidy import (
    Leftovers,
    apply_tidy,
    entries_of,
    keep_reason,
    plan_tidy,
)

# What a plugin with fake GPUs, dynamic MIG and MPS leaves once every claim is gone
# (read off a kind node after its pods were deleted).
WRITTEN = [
    "checkpoint.json",
    "device-names.json",
    "fake-nvml-node-a.json",
    "ledger.json",
    "ledger.json.lock",
    "plugin.lock",
    "locks/GPU-34897535-8f62-7210-08ac-a9c4221ecea9.lock",
]


def make(root: Path, files: list[str], dirs: tuple[str, ...] = ()) -> None:
    for d in dirs:
        (root / d).mkdir(parents=True, exist_ok=True)
    for f in files:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text("x")


def test_an_uninstall_removes_everything_the_plugin_wrote(tmp_path: Path) -> None:
    state = tmp_path / "state"
    # An IMEX node's empty config directory too (read off a kind GB200 tray).
    make(state, WRITTEN, ("mps/claim-0/pipe", "mps/claim-0/log", "imex"))
    plan = plan_tidy(entries_of(state))
    assert sorted(plan.files) == sorted(WRITTEN)
    assert plan.kept == ()
    assert apply_tidy(state, plan) == []
    assert not state.exists()  # empty, and not a mount point here


def test_what_is_not_ours_stays(tmp_path: Path) -> None:
    """A stateDir shared by mistake, and what a damaged checkpoint was moved aside to."""
    state = tmp_path / "state"
    make(
        state, [*WRITTEN, "checkpoint.json.corrupt-1733160000", "other-tool.db", "locks/notes.txt"]
    )
    plan = plan_tidy(entries_of(state))
    assert plan.kept == ("checkpoint.json.corrupt-1733160000", "locks/notes.txt", "other-tool.db")
    apply_tidy(state, plan)
    left = sorted(str(p.relative_to(state)) for p in state.rglob("*"))
    assert left == [
        "checkpoint.json.corrupt-1733160000",
        "locks",
        "locks/notes.txt",
        "other-tool.db",
    ]


def test_a_file_left_in_an_mps_directory_keeps_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    make(state, ["checkpoint.json", "mps/claim-0/pipe/control"])
    plan = plan_tidy(entries_of(state))
    assert plan.kept == ("mps/claim-0/pipe/control",)
    failed = apply_tidy(state, plan)
    assert (state / "mps/claim-0/pipe/control").exists()
    assert set(failed) == {"mps/claim-0/pipe", "mps/claim-0", "mps"}
    assert not (state / "checkpoint.json").exists()


def test_anything_left_to_undo_keeps_the_state() -> None:
    assert keep_reason(Leftovers()) == ""
    assert "2 claims are still prepared" in keep_reason(Leftovers(claims=("uid-1", "uid-2")))
    assert "MIG changes not yet undone: MIG mode on GPU-1" in keep_reason(
        Leftovers(mig_changes=("MIG mode on GPU-1",))
    )
    assert "sharing changes" in keep_reason(Leftovers(sharing_claims=("uid-3",)))
    assert "IMEX daemons not yet stopped for uid-4" in keep_reason(
        Leftovers(imex_claims=("uid-4",))
    )
    # A rolling update's other instance (or a second release) still uses the state.
    assert "another instance" in keep_reason(
        Leftovers(other_instances=("gpu.dradriver.io-abc-reg.sock",))
    )

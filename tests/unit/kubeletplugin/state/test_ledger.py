"""The ledger on its own: every kind of entry kept under its key, an unreadable file moved
aside and reported (never raised), a newer release's file read for what this one knows,
and changes from two plugin instances at once all kept. What the steps write there, and
what a lost checkpoint's unprepare undoes from it, is tested with the steps
(tests/unit/kubeletplugin/hardware/, prepare/test_reconcile_crash_gaps.py)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from dradriver.kubeletplugin.state.ledger import (
    Entries,
    Ledger,
    ModeChange,
    OwnedInstance,
    SharedDaemon,
    held_instances,
)

GPU, OTHER = "GPU-1111", "GPU-2222"


def every_entry(ledger: Ledger) -> None:
    ledger.mig_enabling(GPU)
    ledger.mig_disabling(OTHER, "whole")
    ledger.intending((GPU, 19, 0), "carved")
    ledger.instance_created(OwnedInstance(GPU, 7, 19, 2, "carved"))
    ledger.mode_changing(OTHER, 0, "mps")
    ledger.slice_changing(GPU, "sliced")
    ledger.shared_daemon(OTHER, gpu=OTHER, mode_before=0)
    ledger.member(OTHER, "s-1", "shared")
    ledger.imex_starting("cd-uid", "imex")


def test_every_entry_is_kept_under_its_key_and_read_back(tmp_path: Path) -> None:
    every_entry(Ledger.of(tmp_path))
    doc = json.loads((tmp_path / "ledger.json").read_text())
    assert set(doc) == {
        "version",
        "migEnabled",
        "migDisabled",
        "migInstances",
        "computeMode",
        "timeSlice",
        "shareDaemons",
        "imexDaemons",
    }
    e = Ledger.of(tmp_path).load()  # another instance's view: all from the file
    assert e == Entries(
        mig_enabled={GPU},
        mig_disabled={OTHER: "whole"},
        instances=[
            OwnedInstance(GPU, None, 19, 0, "carved"),
            OwnedInstance(GPU, 7, 19, 2, "carved"),
        ],
        compute_mode={OTHER: ModeChange(0, "mps")},
        time_slice={GPU: "sliced"},
        shared={OTHER: SharedDaemon(OTHER, 0, {"s-1": "shared"})},
        imex={"cd-uid": "imex"},
    )
    assert e.claims() == {"whole", "carved", "mps", "sliced", "shared", "imex"}
    assert e.sharing_claims() == {"mps", "sliced", "shared"}
    assert e.intended_for((GPU, 19, 0)) == "carved" and e.owner(GPU, 7) == "carved"
    assert held_instances(Ledger.of(tmp_path), {(GPU, 19, 2)}) == {(GPU, 19, 0)}


def test_undone_entries_go_and_a_carve_replaces_its_intent(tmp_path: Path) -> None:
    ledger = Ledger.of(tmp_path)
    every_entry(ledger)
    ledger.instance_created(OwnedInstance(GPU, 3, 19, 0, "carved"))  # the intent, carved
    assert [i.gpu_instance_id for i in ledger.load().instances] == [7, 3]
    ledger.mig_enabled_restored(GPU)
    ledger.mig_disabled_restored(OTHER)
    ledger.instance_destroyed(GPU, 7)
    ledger.instance_destroyed(GPU, 3)
    ledger.mode_restored(OTHER)
    ledger.slice_restored(GPU)
    assert ledger.member(OTHER, "s-1", None) == SharedDaemon(OTHER, 0, {})
    ledger.shared_stopped(OTHER)
    ledger.imex_stopped("cd-uid")
    assert ledger.load() == Entries()


def test_the_mode_first_recorded_is_the_one_restored(tmp_path: Path) -> None:
    ledger = Ledger.of(tmp_path)
    assert ledger.mode_changing(GPU, 2, "c") == 2  # PROHIBITED, the admin's
    assert ledger.mode_changing(GPU, 3, "c") == 2  # ours, after a restart: not recorded
    assert ledger.shared_daemon(OTHER, gpu=OTHER, mode_before=1).mode_before == 1
    assert ledger.shared_daemon(OTHER, gpu=OTHER, mode_before=3).mode_before == 1


@pytest.mark.parametrize("content", ["{ torn", "[]", '{"version": 1, "migInstances": [{}]}'])
def test_an_unreadable_ledger_is_moved_aside_and_reported(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "ledger.json").write_text(content)
    ledger = Ledger.of(tmp_path)
    assert ledger.load() == Entries()
    (aside,) = tmp_path.glob("ledger.json.corrupt-*")
    assert aside.read_text() == content  # kept for a human
    assert "LEDGER UNREADABLE" in caplog.text and "nvidia-smi" in caplog.text
    ledger.slice_changing(GPU, "c")  # and the driver carries on with a fresh one
    assert ledger.load().time_slice == {GPU: "c"}


def test_a_change_to_an_unreadable_ledger_sets_it_aside_first(tmp_path: Path) -> None:
    (tmp_path / "ledger.json").write_text("{ torn")
    ledger = Ledger.of(tmp_path)
    ledger.mig_enabling(GPU)
    assert len(list(tmp_path.glob("ledger.json.corrupt-*"))) == 1
    assert ledger.load().mig_enabled == {GPU}


def test_a_newer_releases_ledger_is_read_for_what_this_one_knows(tmp_path: Path) -> None:
    doc = {"version": 2, "timeSlice": {GPU: "c"}, "computeMode": {}, "newKey": [1]}
    (tmp_path / "ledger.json").write_text(json.dumps(doc))
    assert Ledger.of(tmp_path).load().time_slice == {GPU: "c"}
    assert list(tmp_path.glob("ledger.json.corrupt-*")) == []


def test_two_instances_changing_it_at_once_lose_no_change(tmp_path: Path) -> None:
    """Two plugin instances in a rolling update: each its own object, hence its own
    open lock file; every change is a read-modify-write under the lock."""
    first, second = Ledger.of(tmp_path), Ledger.of(tmp_path)
    gpus = [f"GPU-{i:04d}" for i in range(12)]
    threads = [threading.Thread(target=first.mig_enabling, args=(g,)) for g in gpus]
    threads += [threading.Thread(target=second.slice_changing, args=(g, "c")) for g in gpus]
    threads += [threading.Thread(target=second.intending, args=((g, 19, 0), "c")) for g in gpus]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    e = first.load()
    assert e.mig_enabled == set(gpus) and set(e.time_slice) == set(gpus)
    assert {i.gpu_uuid for i in e.instances} == set(gpus)

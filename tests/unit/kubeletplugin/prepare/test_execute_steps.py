"""The one undo runner: every undo runs, newest first, on the record as it last stood; a
failure is logged, the rest still run, and the first is the claim's error, naming its
layer. Applies run in order, each on the record the one before returned."""

from __future__ import annotations

import dataclasses

import pytest

from dradriver.errors import CdiError, CheckpointError, MigError, SharingError
from dradriver.kubeletplugin.prepare.execute import Step, apply_all, undo_all
from dradriver.kubeletplugin.state.records import PREPARE_STARTED, ClaimRecord

REC = ClaimRecord("u", "ns", "c", PREPARE_STARTED)


def test_every_undo_runs_newest_first_and_none_failing_is_none() -> None:
    done: list[tuple[str, str]] = []
    steps = [
        Step(layer, layer, lambda r, layer=layer: done.append((layer, r.uid))) for layer in "ABC"
    ]
    assert undo_all(steps, REC) is None
    assert done == [("C", "u"), ("B", "u"), ("A", "u")]


def test_a_failed_undo_does_not_stop_the_others_and_the_first_is_the_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    done: list[str] = []

    def busy(rec: ClaimRecord) -> None:
        raise MigError("destroy failed", in_use=True)

    def mps(rec: ClaimRecord) -> None:
        raise SharingError("daemon would not stop", reason="undo")

    steps = [
        Step("MIG", "MIG device gpu-0-mig-1g10gb-0", busy),
        Step("sharing", "sharing setup", mps),
        Step("CDI", "removing the CDI spec", lambda r: done.append("cdi")),
    ]
    err = undo_all(steps, REC)
    assert done == ["cdi"]
    # The newest failure first (sharing), the MIG one logged too.
    assert isinstance(err, SharingError)
    assert str(err) == (
        "claim ns/c: sharing layer: sharing setup: daemon would not stop; the kubelet retries"
    )
    logged = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert logged == ["could not undo a step", "could not undo a step"]
    only_mig = undo_all(steps[:1], REC)
    assert isinstance(only_mig, MigError) and only_mig.in_use
    assert "MIG layer: MIG device gpu-0-mig-1g10gb-0: destroy failed (a process still uses it)" in (
        str(only_mig)
    )


@pytest.mark.parametrize(
    ("layer", "exc", "kind", "text"),
    [
        ("CDI", OSError(13, "Permission denied"), CdiError, "CDI layer: removing the CDI spec"),
        ("MIG", OSError(28, "No space left"), CheckpointError, "checkpoint layer"),
    ],
)
def test_an_os_error_names_the_layer_it_came_from(
    layer: str, exc: Exception, kind: type[Exception], text: str
) -> None:
    def fail(rec: ClaimRecord) -> None:
        raise exc

    err = undo_all([Step(layer, "removing the CDI spec", fail)], REC)
    assert isinstance(err, kind) and text in str(err)


def test_apply_runs_in_order_on_the_record_each_leaves_and_stops_at_a_failure() -> None:
    seen: list[float] = []

    def bump(rec: ClaimRecord) -> ClaimRecord:
        return dataclasses.replace(rec, updated_at=rec.updated_at + 1)

    def fail(rec: ClaimRecord) -> ClaimRecord:
        raise MigError("no room")

    ok = [Step("MIG", "a", print, bump), Step("CDI", "b", print, bump)]
    out = apply_all(ok, REC, lambda r: seen.append(r.updated_at))
    assert out.updated_at == 2 and seen == [1, 2] and REC.updated_at == 0  # REC untouched
    seen.clear()
    with pytest.raises(MigError, match="no room"):
        apply_all([ok[0], Step("MIG", "x", print, fail), ok[1]], REC, lambda r: seen.append(1))
    assert seen == [1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        REC.state = "x"  # type: ignore[misc]

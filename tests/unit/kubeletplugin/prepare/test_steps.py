"""The one undo runner: every undo runs, newest first; a failure is logged, the rest still
run, and the first is the claim's error, naming its layer."""

from __future__ import annotations

import pytest

from dradriver.errors import CdiError, CheckpointError, MigError, SharingError
from dradriver.kubeletplugin.prepare.steps import Step, apply_all, undo_all


def test_every_undo_runs_newest_first_and_none_failing_is_none() -> None:
    done: list[str] = []
    steps = [Step(layer, layer, lambda layer=layer: done.append(layer)) for layer in "ABC"]
    assert undo_all(steps, claim="ns/c", uid="u") is None
    assert done == ["C", "B", "A"]


def test_a_failed_undo_does_not_stop_the_others_and_the_first_is_the_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    done: list[str] = []

    def busy() -> None:
        raise MigError("destroy failed", in_use=True)

    def mps() -> None:
        raise SharingError("daemon would not stop", reason="undo")

    steps = [
        Step("MIG", "MIG device gpu-0-mig-1g10gb-0", busy),
        Step("sharing", "sharing setup", mps),
        Step("CDI", "removing the CDI spec", lambda: done.append("cdi")),
    ]
    err = undo_all(steps, claim="ns/c", uid="u")
    assert done == ["cdi"]
    # The newest failure first (sharing), the MIG one logged too.
    assert isinstance(err, SharingError)
    assert str(err) == (
        "claim ns/c: sharing layer: sharing setup: daemon would not stop; the kubelet retries"
    )
    logged = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert logged == ["could not undo a step", "could not undo a step"]
    only_mig = undo_all(steps[:1], claim="ns/c", uid="u")
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
    def fail() -> None:
        raise exc

    err = undo_all([Step(layer, "removing the CDI spec", fail)], claim="ns/c", uid="u")
    assert isinstance(err, kind) and text in str(err)


def test_apply_runs_in_order_and_stops_at_the_first_failure() -> None:
    done: list[str] = []

    def fail() -> None:
        raise MigError("no room")

    steps = [
        Step("MIG", "a", lambda: None, lambda: done.append("a")),
        Step("MIG", "b", lambda: None, fail),
        Step("CDI", "c", lambda: None, lambda: done.append("c")),
    ]
    with pytest.raises(MigError, match="no room"):
        apply_all(steps)
    assert done == ["a"]

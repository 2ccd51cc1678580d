"""What this release refuses of a checkpoint a newer release wrote (codec.py's
minReader), and the words it refuses with: the whole file when its layout is beyond this
release, else only the claims recorded in a form it cannot read."""

from __future__ import annotations

from dradriver.errors import ClaimStateError
from dradriver.kubeletplugin.claimref import ClaimRef
from dradriver.kubeletplugin.state.records import CURRENT_VERSION, Checkpoint


def newer_file(path: str, cp: Checkpoint) -> str:
    return (
        f"checkpoint layer: {path} was written by a newer dradriver release "
        f"(checkpoint version {cp.version}, readable from format {cp.min_reader} on; "
        f"this release reads {CURRENT_VERSION}); "
        "this release leaves it and every claim in it untouched. Roll the plugin "
        "forward again, or move the file aside to start from an empty state (the "
        "devices of the claims in it then need cleaning up by hand)"
    )


def check_readable(cp: Checkpoint, ref: ClaimRef, op: str) -> None:
    """A claim a newer release recorded in a form this one cannot read is left as it
    is: neither prepared again, nor unprepared, nor undone (the other claims are)."""
    if ref.uid in cp.unreadable:
        raise ClaimStateError(
            f"checkpoint layer: claim {ref} was recorded by a newer dradriver release in "
            f"a form this release (format {CURRENT_VERSION}) cannot read; not {op} it, "
            "and leaving what it holds untouched. Roll the plugin forward again",
            reason="newer_record",
        )

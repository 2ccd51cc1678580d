"""The checkpoint file's format: an envelope every release keeps ("version", "checksum"
over the canonical payload, "minReader"), the payload's claims, and the rules by which an
older release reads a newer file (docs/design.md, "The checkpoint's format").
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from dradriver.errors import ClaimStateError
from dradriver.kubeletplugin.state.files import CheckpointCorrupt, from_json, to_json
from dradriver.kubeletplugin.state.records import (
    CURRENT_VERSION,
    PREPARE_STARTED,
    STATES,
    Checkpoint,
    ClaimRecord,
    ClaimRef,
)

# The oldest format whose readers can read what this release writes (see above).
MIN_READER = 1


def _canonical(payload: Any) -> bytes:
    return json.dumps(
        payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode()


def payload_checksum(payload: Any) -> str:
    return "sha256:" + hashlib.sha256(_canonical(payload)).hexdigest()


def encode_checkpoint(cp: Checkpoint) -> bytes:
    """The file content for `cp`, always in the current format. Raises ValueError or
    TypeError if a record holds something JSON cannot represent."""
    for uid, rec in cp.claims.items():
        if uid != rec.uid:
            raise ValueError(f"checkpoint: claim stored under {uid!r} has uid {rec.uid!r}")
        if rec.state not in STATES:
            raise ValueError(f"checkpoint: claim {uid} has unknown state {rec.state!r}")
    claims = {**cp.unreadable, **{uid: to_json(rec) for uid, rec in cp.claims.items()}}
    payload = {**cp.unknown, "bootId": cp.boot_id, "claims": claims}
    # The payload is encoded once, for its checksum and as the file's payload (the
    # envelope's keys in sorted order, as before).
    body = _canonical(payload)
    checksum = "sha256:" + hashlib.sha256(body).hexdigest()
    return (
        b'{"checksum":"' + checksum.encode() + b'","minReader":' + str(MIN_READER).encode()
        + b',"payload":' + body
        + b',"version":' + str(CURRENT_VERSION).encode() + b"}\n"
    )  # fmt: skip


def _reject_constant(name: str) -> Any:
    raise CheckpointCorrupt(f"not valid JSON: {name} is not a JSON number")


@dataclass(frozen=True)
class _Envelope:
    version: int
    checksum: str
    payload: dict[str, Any]
    min_reader: int | None = None


@dataclass(frozen=True)
class _Payload:
    boot_id: str
    claims: dict[str, Any]
    unknown: dict[str, Any] = field(default_factory=dict)


def _payload(payload: dict[str, Any], version: int, *, newer: bool, notes: list[str]) -> Checkpoint:
    p: _Payload = from_json(_Payload, payload, "payload")
    claims: dict[str, ClaimRecord] = {}
    unreadable: dict[str, Any] = {}
    for k, v in p.claims.items():
        needs = v.get("minReader") if isinstance(v, dict) else None
        if type(needs) is int and needs > CURRENT_VERSION:
            unreadable[k] = v
            continue
        # Its own UID, and a state this release knows (one from a newer release is
        # taken as PrepareStarted: undone or redone).
        where = f"claims[{k!r}]"
        rec: ClaimRecord = from_json(ClaimRecord, v, where)
        if rec.uid != k:
            raise CheckpointCorrupt(f"{where}: stored under another UID than its own ({rec.uid!r})")
        if rec.state not in STATES:
            if not newer:
                raise CheckpointCorrupt(f"{where}.state: unknown state {rec.state!r}")
            notes.append(
                f"claim {rec.uid}: unknown state {rec.state!r} from a newer release, "
                f"treated as {PREPARE_STARTED}"
            )
            rec = dataclasses.replace(rec, state=PREPARE_STARTED)
        claims[k] = rec
    if unreadable:
        notes.append(
            f"claims a newer release recorded in a form this release cannot read (their "
            f"minReader is above {CURRENT_VERSION}), kept untouched: "
            + ", ".join(sorted(unreadable))
        )
    return Checkpoint(
        version=version, boot_id=p.boot_id, claims=claims, unknown=p.unknown, unreadable=unreadable
    )


def parse_checkpoint(data: bytes) -> tuple[Checkpoint, list[str]]:
    """Decodes a checkpoint file of any version this release knows how to read.

    Returns the checkpoint and notes worth a warning (a newer release, unknown
    fields). Raises CheckpointCorrupt for anything that cannot be trusted.
    """
    try:
        doc = json.loads(data, parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointCorrupt(f"not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise CheckpointCorrupt("not valid JSON: nested too deeply") from exc
    if not isinstance(doc, dict):
        raise CheckpointCorrupt("expected a JSON object at the top level")
    notes: list[str] = []
    env: _Envelope = from_json(_Envelope, doc, "checkpoint")
    version = env.version
    if version < 1:
        raise CheckpointCorrupt(f"checkpoint.version: {version} is not a version")
    newer = version > CURRENT_VERSION
    # Without "minReader", a newer version is assumed to need its own format.
    min_reader = env.min_reader if env.min_reader is not None else version if newer else 1
    if newer:
        notes.append(
            f"checkpoint version {version} was written by a newer release; "
            f"reading the version {CURRENT_VERSION} fields it still has"
        )
    payload = env.payload
    if env.checksum != payload_checksum(payload):
        raise CheckpointCorrupt("checksum mismatch: torn write or edited by hand")
    try:
        cp = _payload(payload, version, newer=newer or min_reader > CURRENT_VERSION, notes=notes)
    except CheckpointCorrupt as exc:
        if min_reader <= CURRENT_VERSION:
            raise
        # Complete (the checksum holds) but in a layout this release cannot read: not
        # damaged, so not moved aside; the caller refuses it (min_reader) and keeps it.
        notes.append(f"not readable by this release: {exc}")
        cp = Checkpoint(version=version)
    cp.min_reader = min_reader
    kept = list(cp.unknown)
    for rec in cp.claims.values():
        kept += [f"claims.{rec.uid}.{k}" for k in rec.unknown]
        for d in rec.devices:
            kept += [f"claims.{rec.uid}.{d.device}.{k}" for k in d.unknown]
    if kept:
        notes.append(f"kept fields this release does not know: {', '.join(sorted(kept))}")
    return cp, notes


# -- what this release refuses of a file a newer release wrote, and the words it refuses
# with: the whole file when its layout is beyond this release (minReader), else only the
# claims recorded in a form it cannot read (their own minReader).


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

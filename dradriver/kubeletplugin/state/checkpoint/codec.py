"""The checkpoint file format: an envelope every release keeps, a checksum over the
canonical payload, and migrations from older formats.

File layout (version 1)::

    {"version": 1, "checksum": "sha256:<hex>", "minReader": 1,
     "payload": {"bootId": ..., "claims": {...}}, "seq": 12}

"seq" counted the saves of the releases that wrote the file in place (store.py reads
their write-ahead copies once); it lies outside the payload, so a release before it
neither warned about it nor kept it. This release writes none. Older releases padded the
file with spaces, which JSON readers skip.

"version", "checksum" and "payload" are the envelope every release must keep, so that an
older release can still verify and partly read a newer file. The checksum covers the
canonical JSON of the payload (sorted keys, no spaces, ASCII), so a torn write or a hand
edit is detected rather than trusted. The records inside are those of records.py.

Who can read a file: "minReader", the oldest format version whose readers can read it.
A rollback by one release must keep working (a release that refused a newer file left
every pod with a claim stuck terminating), so a release writes the lowest minReader its
content allows, and reads a file whose minReader is at most CURRENT_VERSION whatever its
"version": the fields it does not know are carried through, as always. The rules for
later releases:

- a change an older reader can skip (a new optional key, a new record type under a key it
  keeps) bumps "version" at most, never minReader;
- a change that makes a claim's record mean something else to an older reader (a new
  state, a new kind of device it would release wrongly) gives that claim its own
  "minReader" (a key of the claim's record, which an older release carries through): an
  older release then refuses that claim alone, and prepares and unprepares the others;
- only a change of the envelope or the payload's layout bumps the file's "minReader": an
  older release then refuses the whole file and leaves it untouched.

"minReader" lies outside the payload, like "seq": the release before it (it read only
"version", and refuses a "version" above 1) neither warns about it nor keeps it, so this
release writes "version": 1. A file without "minReader" was written before it: version
1 or lower is readable, a higher version is assumed to need its own format.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from dradriver.kubeletplugin.state.records import (
    CURRENT_VERSION,
    PREPARE_COMPLETED,
    STATES,
    Checkpoint,
    CheckpointCorrupt,
    ClaimRecord,
    PreparedDevice,
    get,
    optional,
    str_list,
    unknown,
)

_PAYLOAD_KEYS = ("bootId", "claims")
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
    claims = {uid: raw for uid, raw in cp.unreadable.items() if uid not in cp.claims}
    claims.update({uid: rec.to_json() for uid, rec in cp.claims.items()})
    payload = {**cp.unknown, "bootId": cp.boot_id, "claims": claims}
    # The payload is encoded once, for its checksum and as the file's payload (the
    # envelope's keys in sorted order, as before).
    body = _canonical(payload)
    checksum = "sha256:" + hashlib.sha256(body).hexdigest()
    seq = b"" if cp.seq is None else b',"seq":' + str(cp.seq).encode()
    return (
        b'{"checksum":"' + checksum.encode() + b'","minReader":' + str(MIN_READER).encode()
        + b',"payload":' + body + seq
        + b',"version":' + str(CURRENT_VERSION).encode() + b"}\n"
    )  # fmt: skip


def _reject_constant(name: str) -> Any:
    raise CheckpointCorrupt(f"not valid JSON: {name} is not a JSON number")


def _from_v0(doc: dict[str, Any], notes: list[str]) -> Checkpoint:
    """Version 0 (releases before versioning; "version" is 0 or absent):

        {"bootId": "...", "claims": [{"uid", "namespace", "name",
          "devices": [{"request", "pool", "device", "cdiDeviceIds", "uuid"?}]}]}

    No states (a claim was written only once prepared, so all are completed), no
    checksum, one request name per device, no timestamps.
    """
    claims: dict[str, ClaimRecord] = {}
    for i, obj in enumerate(get(doc, "claims", list, where="checkpoint")):
        where = f"claims[{i}]"
        if not isinstance(obj, dict):
            raise CheckpointCorrupt(f"{where}: expected an object")
        devices = []
        for j, d in enumerate(get(obj, "devices", list, where=where)):
            dw = f"{where}.devices[{j}]"
            if not isinstance(d, dict):
                raise CheckpointCorrupt(f"{dw}: expected an object")
            devices.append(
                PreparedDevice(
                    request_names=[get(d, "request", str, where=dw)],
                    pool=get(d, "pool", str, where=dw),
                    device=get(d, "device", str, where=dw),
                    cdi_device_ids=str_list(d, "cdiDeviceIds", dw),
                    uuid=optional(d, "uuid", str, default=None, where=dw),
                )
            )
        rec = ClaimRecord(
            uid=get(obj, "uid", str, where=where),
            namespace=get(obj, "namespace", str, where=where),
            name=get(obj, "name", str, where=where),
            state=PREPARE_COMPLETED,
            devices=devices,
            migrated_from=0,
        )
        if rec.uid in claims:
            raise CheckpointCorrupt(f"{where}: claim {rec.uid} listed twice")
        claims[rec.uid] = rec
    notes.append(f"migrated {len(claims)} claims from checkpoint version 0")
    return Checkpoint(
        version=0,
        boot_id=optional(doc, "bootId", str, default="", where="checkpoint"),
        claims=claims,
    )


def _payload(
    doc: dict[str, Any], payload: dict[str, Any], version: int, *, newer: bool, notes: list[str]
) -> Checkpoint:
    claims: dict[str, ClaimRecord] = {}
    unreadable: dict[str, Any] = {}
    for k, v in get(payload, "claims", dict, where="payload").items():
        needs = v.get("minReader", 1) if isinstance(v, dict) else 1
        if isinstance(needs, int) and not isinstance(needs, bool) and needs > CURRENT_VERSION:
            unreadable[k] = v
            continue
        claims[k] = ClaimRecord.from_json(k, v, newer, notes=notes)
    if unreadable:
        notes.append(
            f"claims a newer release recorded in a form this release cannot read (their "
            f"minReader is above {CURRENT_VERSION}), kept untouched: "
            + ", ".join(sorted(unreadable))
        )
    return Checkpoint(
        version=version,
        boot_id=get(payload, "bootId", str, where="payload"),
        seq=optional(doc, "seq", int, default=None, where="checkpoint"),
        claims=claims,
        unknown=unknown(payload, _PAYLOAD_KEYS),
        unreadable=unreadable,
    )


def parse_checkpoint(data: bytes) -> tuple[Checkpoint, list[str]]:
    """Decodes a checkpoint file of any version this release knows how to read.

    Returns the checkpoint and notes worth a warning (migration, newer release, unknown
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
    if "version" not in doc:
        return _from_v0(doc, notes), notes
    version = get(doc, "version", int, where="checkpoint")
    if version < 0:
        raise CheckpointCorrupt(f"checkpoint.version: {version} is not a version")
    if version == 0:
        return _from_v0(doc, notes), notes
    newer = version > CURRENT_VERSION
    # Without "minReader", a newer version is assumed to need its own format.
    min_reader = optional(
        doc, "minReader", int, default=version if newer else 1, where="checkpoint"
    )
    if newer:
        notes.append(
            f"checkpoint version {version} was written by a newer release; "
            f"reading the version {CURRENT_VERSION} fields it still has"
        )
    payload = get(doc, "payload", dict, where="checkpoint")
    checksum = get(doc, "checksum", str, where="checkpoint")
    if checksum != payload_checksum(payload):
        raise CheckpointCorrupt("checksum mismatch: torn write or edited by hand")
    try:
        cp = _payload(
            doc, payload, version, newer=newer or min_reader > CURRENT_VERSION, notes=notes
        )
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
        kept += [f"claims.{rec.uid}.{k}" for k in rec.unknown.fields]
        kept += [f"claims.{rec.uid}.extra.{k}" for k in rec.extra_unknown.fields]
        for d in rec.devices:
            kept += [f"claims.{rec.uid}.{d.device}.{k}" for k in d.unknown]
            kept += [f"claims.{rec.uid}.{d.device}.extra.{k}" for k in d.extra_unknown]
    if kept:
        notes.append(f"kept fields this release does not know: {', '.join(sorted(kept))}")
    return cp, notes

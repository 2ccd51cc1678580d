"""The checkpoint file format: an envelope every release keeps, a checksum over the
canonical payload, and migrations from older formats.

File layout (version 1)::

    {"version": 1, "checksum": "sha256:<hex>", "payload": {"bootId": ..., "claims": {...}},
     "seq": 12}

then spaces (store.py rewrites the file in place; JSON readers skip them). "seq" counts
this release's saves (store.py): outside the payload, so a release before it neither
warns about it nor keeps it, and a file without one was written by another release.

"version", "checksum" and "payload" are the envelope every release must keep, so that an
older release can still verify and partly read a newer file. The checksum covers the
canonical JSON of the payload (sorted keys, no spaces, ASCII), so a torn write or a hand
edit is detected rather than trusted. The records inside are those of records.py.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tests.support.previous_release.records import (
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
    payload = {
        **cp.unknown,
        "bootId": cp.boot_id,
        "claims": {uid: rec.to_json() for uid, rec in cp.claims.items()},
    }
    # The payload is encoded once, for its checksum and as the file's payload (the
    # envelope's keys in sorted order, as before).
    body = _canonical(payload)
    checksum = "sha256:" + hashlib.sha256(body).hexdigest()
    seq = b"" if cp.seq is None else b',"seq":' + str(cp.seq).encode()
    return (
        b'{"checksum":"' + checksum.encode() + b'","payload":' + body + seq
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
    for i, obj in enumerate(get(doc, "claims", list, "checkpoint")):
        where = f"claims[{i}]"
        if not isinstance(obj, dict):
            raise CheckpointCorrupt(f"{where}: expected an object")
        devices = []
        for j, d in enumerate(get(obj, "devices", list, where)):
            dw = f"{where}.devices[{j}]"
            if not isinstance(d, dict):
                raise CheckpointCorrupt(f"{dw}: expected an object")
            devices.append(
                PreparedDevice(
                    request_names=[get(d, "request", str, dw)],
                    pool=get(d, "pool", str, dw),
                    device=get(d, "device", str, dw),
                    cdi_device_ids=str_list(d, "cdiDeviceIds", dw),
                    uuid=optional(d, "uuid", str, None, dw),
                )
            )
        rec = ClaimRecord(
            uid=get(obj, "uid", str, where),
            namespace=get(obj, "namespace", str, where),
            name=get(obj, "name", str, where),
            state=PREPARE_COMPLETED,
            devices=devices,
        )
        if rec.uid in claims:
            raise CheckpointCorrupt(f"{where}: claim {rec.uid} listed twice")
        claims[rec.uid] = rec
    notes.append(f"migrated {len(claims)} claims from checkpoint version 0")
    return Checkpoint(
        version=0, boot_id=optional(doc, "bootId", str, "", "checkpoint"), claims=claims
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
    version = get(doc, "version", int, "checkpoint")
    if version < 0:
        raise CheckpointCorrupt(f"checkpoint.version: {version} is not a version")
    if version == 0:
        return _from_v0(doc, notes), notes
    newer = version > CURRENT_VERSION
    if newer:
        notes.append(
            f"checkpoint version {version} was written by a newer release; "
            f"reading the version {CURRENT_VERSION} fields it still has"
        )
    payload = get(doc, "payload", dict, "checkpoint")
    checksum = get(doc, "checksum", str, "checkpoint")
    if checksum != payload_checksum(payload):
        raise CheckpointCorrupt("checksum mismatch: torn write or edited by hand")
    claims_obj = get(payload, "claims", dict, "payload")
    cp = Checkpoint(
        version=version,
        boot_id=get(payload, "bootId", str, "payload"),
        seq=optional(doc, "seq", int, None, "checkpoint"),
        claims={k: ClaimRecord.from_json(k, v, newer, notes) for k, v in claims_obj.items()},
        unknown=unknown(payload, _PAYLOAD_KEYS),
    )
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

"""Typed reading of the checkpoint's JSON: each helper names the path of what it found
wrong, so a damaged file is reported where it is damaged."""

from __future__ import annotations

from typing import Any


class CheckpointCorrupt(ValueError):
    """The bytes are not a checkpoint this release can trust."""


def get(obj: dict[str, Any], key: str, typ: type | tuple[type, ...], *, where: str) -> Any:
    if key not in obj:
        raise CheckpointCorrupt(f"{where}: missing {key!r}")
    value = obj[key]
    types = typ if isinstance(typ, tuple) else (typ,)
    # bool is an int in Python but never a valid number field here.
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        names = " or ".join(t.__name__ for t in types)
        raise CheckpointCorrupt(f"{where}.{key}: expected {names}, got {value!r:.60}")
    return value


def optional(
    obj: dict[str, Any], key: str, typ: type | tuple[type, ...], *, default: Any, where: str
) -> Any:
    if key not in obj or obj[key] is None:
        return default
    return get(obj, key, typ, where=where)


def str_list(obj: dict[str, Any], key: str, where: str) -> list[str]:
    value = get(obj, key, list, where=where)
    if not all(isinstance(v, str) for v in value):
        raise CheckpointCorrupt(f"{where}.{key}: expected a list of strings")
    return list(value)


def unknown(obj: dict[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in known}


def obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CheckpointCorrupt(f"{where}: expected an object")
    return value

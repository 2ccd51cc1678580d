"""Pure checks of the device configs in a ResourceClaim or ResourceClaimTemplate.

Every message starts with the field path in the object the user wrote, so the same
functions serve the admission webhook and, later, prepare (which has the claim's spec
too). Only configs for our driver are checked: other drivers own their parameters.
No I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dradriver.api.config import ConfigError, decode

# Where the DeviceClaim (`requests`, `constraints`, `config`) sits in each kind.
DEVICES_PATH: dict[str, tuple[str, ...]] = {
    "ResourceClaim": ("spec", "devices"),
    "ResourceClaimTemplate": ("spec", "spec", "devices"),
}


@dataclass(frozen=True)
class Problem:
    field: str  # e.g. spec.devices.config[0].opaque.parameters
    message: str  # the whole message; it starts with the field path (or a path below it)

    def __str__(self) -> str:
        return self.message


def _list(v: Any) -> list[Any]:
    # The API server has checked the schema, but this code also sees objects from
    # elsewhere (tests, a future prepare path); a wrong shape is "nothing there".
    return v if isinstance(v, list) else []


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def devices_of(kind: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """The DeviceClaim of a claim or template; {} when the kind has none or it is missing."""
    cur: Any = obj
    for key in DEVICES_PATH.get(kind, ("",)):
        cur = _dict(cur).get(key)
    return _dict(cur)


def request_names(devices: Mapping[str, Any]) -> dict[str, list[str]]:
    """Top-level request name -> its firstAvailable subrequest names ([] for a plain one),
    in the order the claim lists them."""
    out: dict[str, list[str]] = {}
    for r in _list(devices.get("requests")):
        r = _dict(r)
        if isinstance(r.get("name"), str):
            subs = [_dict(s).get("name") for s in _list(r.get("firstAvailable"))]
            out[r["name"]] = [s for s in subs if isinstance(s, str)]
    return out


def reference_problems(
    devices: Mapping[str, Any], refs: Sequence[Any], where: str
) -> list[Problem]:
    """Each name a config lists under `requests` must be a request of the claim, or
    `request/subrequest` for a subrequest of a firstAvailable request."""
    names = request_names(devices)
    known = [f"{r}/{s}" if s else r for r, subs in names.items() for s in ["", *subs]]
    allowed = f"use one of {', '.join(known)}" if known else "the claim has no requests"
    problems = []
    for i, ref in enumerate(refs):
        top, sep, sub = str(ref).partition("/")
        if isinstance(ref, str) and top in names and (not sep or sub in names[top]):
            continue
        at = f"{where}[{i}]"
        problems.append(Problem(at, f"{at}: {ref!r} is not a request of this claim; {allowed}"))
    return problems


def devices_problems(devices: Mapping[str, Any], driver: str, where: str) -> list[Problem]:
    """Problems with `driver`'s configs in one DeviceClaim found at path `where`: their
    parameters must decode (gpu.dradriver.io/v1alpha1) and their requests must exist."""
    problems: list[Problem] = []
    for i, cfg in enumerate(_list(devices.get("config"))):
        cfg = _dict(cfg)
        opaque = _dict(cfg.get("opaque"))
        if opaque.get("driver") != driver:
            continue
        at = f"{where}.config[{i}]"
        problems += reference_problems(devices, _list(cfg.get("requests")), f"{at}.requests")
        params_at = f"{at}.opaque.parameters"
        try:
            decode(opaque.get("parameters"), params_at)
        except ConfigError as exc:
            problems.append(Problem(params_at, str(exc)))
    return problems


def object_problems(kind: str, obj: Mapping[str, Any], driver: str) -> list[Problem]:
    """Problems with a ResourceClaim or ResourceClaimTemplate; [] for any other kind."""
    if kind not in DEVICES_PATH:
        return []
    return devices_problems(devices_of(kind, obj), driver, ".".join(DEVICES_PATH[kind]))

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
from dradriver.api.suggest import nearest

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
        close = nearest(ref, known) if isinstance(ref, str) else None
        hint = f" (did you mean {close}?)" if close else ""
        problems.append(
            Problem(at, f"{at}: {ref!r} is not a request of this claim{hint}; {allowed}")
        )
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
            config = decode(opaque.get("parameters"), params_at)
        except ConfigError as exc:
            problems.append(Problem(params_at, str(exc)))
            continue
        if config.sharing is not None:
            problems += shared_problems(
                devices,
                _list(cfg.get("requests")),
                config.sharing.strategy,
                params_at=params_at,
                where=where,
            )
    return problems


def consuming_requests(devices: Mapping[str, Any], where: str) -> dict[str, str]:
    """Requests (and `request/subrequest`s) that ask for part of a device's capacity
    (consumable capacity: they are shares), with the path of their capacity field."""
    out: dict[str, str] = {}
    for i, r in enumerate(_list(devices.get("requests"))):
        r = _dict(r)
        name = r.get("name")
        if not isinstance(name, str):
            continue
        if _dict(_dict(r.get("exactly")).get("capacity")).get("requests"):
            out[name] = f"{where}.requests[{i}].exactly.capacity"
        for j, sub in enumerate(_list(r.get("firstAvailable"))):
            sub = _dict(sub)
            if _dict(sub.get("capacity")).get("requests") and isinstance(sub.get("name"), str):
                out[f"{name}/{sub['name']}"] = f"{where}.requests[{i}].firstAvailable[{j}].capacity"
    return out


def shared_problems(
    devices: Mapping[str, Any], refs: Sequence[Any], strategy: str, *, params_at: str, where: str
) -> list[Problem]:
    """A share of a device runs beside the device's other shares under the one MPS
    daemon the plugin keeps for them, with the limits its allocation gives it; a
    time-slicing or MPS config of its own would take the device over for one claim."""
    consuming = consuming_requests(devices, where)
    named = {str(r) for r in refs}
    hit = [
        (req, at)
        for req, at in consuming.items()
        if not named or req in named or req.split("/", 1)[0] in named
    ]
    if not hit:
        return []
    req, at = hit[0]
    field = f"{params_at}.sharing"
    return [
        Problem(
            field,
            f"{field}: a {strategy} config cannot apply to request {req!r}, which asks for "
            f"part of a device's capacity ({at}): a share runs beside the device's other "
            "shares, limited to what it was allocated, so it cannot be time-sliced or given "
            "an MPS daemon of its own. Drop the sharing config for this request, or ask for "
            "a whole device (no capacity requests)",
        )
    ]


# NVIDIA's DRA driver's name, which dradriver takes under the chart's nvidiaCompatible.
NVIDIA_DRIVER = "gpu.nvidia.com"
# NVIDIA's DeviceClasses for what dradriver does not do: a claim naming one would wait
# unallocated forever, so as NVIDIA's driver dradriver refuses it at apply time.
NVIDIA_CLASSES_NOT_SERVED = {
    "vfio.gpu.nvidia.com": "GPU passthrough to virtual machines (VFIO) is not something "
    "dradriver prepares",
    "compute-domain-default-channel.nvidia.com": "dradriver's ComputeDomains "
    "(gpu.dradriver.io/v1alpha1) make their own claim templates",
    "compute-domain-channel.nvidia.com": "dradriver's ComputeDomains (gpu.dradriver.io/"
    "v1alpha1) make their own claim templates",
    "compute-domain-daemon.nvidia.com": "dradriver runs a ComputeDomain's IMEX daemon "
    "itself; there is no daemon device",
    "imex.nvidia.com": "dradriver's ComputeDomains (gpu.dradriver.io/v1alpha1) make their "
    "own claim templates",
}


def class_problems(devices: Mapping[str, Any], where: str) -> list[Problem]:
    """Requests (and firstAvailable subrequests) naming a class of NVIDIA's that
    dradriver, installed as NVIDIA's driver, does not serve."""
    problems = []
    for i, r in enumerate(_list(devices.get("requests"))):
        r = _dict(r)
        choices = [(f"{where}.requests[{i}].exactly", _dict(r.get("exactly")))]
        choices += [
            (f"{where}.requests[{i}].firstAvailable[{j}]", _dict(s))
            for j, s in enumerate(_list(r.get("firstAvailable")))
        ]
        for at, req in choices:
            name = req.get("deviceClassName")
            why = NVIDIA_CLASSES_NOT_SERVED.get(name) if isinstance(name, str) else None
            if why:
                field = f"{at}.deviceClassName"
                said = f"{name} is a class of NVIDIA's DRA driver that dradriver does not serve"
                problems.append(Problem(field, f"{field}: {said}: {why}"))
    return problems


def object_problems(kind: str, obj: Mapping[str, Any], driver: str) -> list[Problem]:
    """Problems with a ResourceClaim or ResourceClaimTemplate; [] for any other kind."""
    if kind not in DEVICES_PATH:
        return []
    where = ".".join(DEVICES_PATH[kind])
    devices = devices_of(kind, obj)
    unserved = class_problems(devices, where) if driver == NVIDIA_DRIVER else []
    return unserved + devices_problems(devices, driver, where)

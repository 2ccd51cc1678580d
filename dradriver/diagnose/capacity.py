"""Capacity requests as the 1.34 scheduler weighs them (pure): what a request consumes of a
device by its requestPolicy, whether that violates the policy, and whether it fits beside
the shares the device already holds (consumable capacity, KEP-5075). The rules are the
allocator's, v0.34.4 structured/internal/experimental/consumable_capacity.go:

- a capacity the request does not name consumes the policy's default, or all of it
  when there is no policy;
- a named amount is rounded up to the range's min and then to a whole step from it (or
  to the next of the valid values); without a policy it is taken as written;
- the result violates the policy above the range's max, off its steps or not among the
  valid values (the default never does);
- a device that allows multiple allocations fits when every capacity's consumption plus
  what its shares hold stays within its value; any other device when each named amount
  is within its value. Naming a capacity the device does not have never fits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dradriver.api import quantity


@dataclass(frozen=True)
class Policy:
    default: Fraction | None = None
    min: Fraction | None = None
    max: Fraction | None = None
    step: Fraction | None = None
    values: tuple[Fraction, ...] = ()


@dataclass(frozen=True)
class Capacity:
    value: Fraction
    policy: Policy | None = None


def _q(v: Any) -> Fraction | None:
    return None if v is None else quantity.parse(str(v))


def capacities(spec: Mapping[str, Any]) -> dict[str, Capacity]:
    """A ResourceSlice device's capacity map, by the key a request names it by."""
    out: dict[str, Capacity] = {}
    for name, c in (spec.get("capacity") or {}).items():
        p = c.get("requestPolicy")
        policy = None
        if isinstance(p, Mapping):
            rng = p.get("validRange") or {}
            policy = Policy(
                _q(p.get("default")),
                _q(rng.get("min")),
                _q(rng.get("max")),
                _q(rng.get("step")),
                tuple(quantity.parse(str(v)) for v in p.get("validValues") or ()),
            )
        out[name] = Capacity(quantity.parse(str(c.get("value", "0"))), policy)
    return out


def consumption(requested: Fraction | None, cap: Capacity) -> Fraction:
    p = cap.policy
    if requested is None:
        return p.default if p is not None and p.default is not None else cap.value
    if p is None:
        return requested
    if p.min is not None:
        if requested < p.min:
            return p.min
        if p.step is None:
            return requested
        # Quantity.Value() rounds a fraction up to a whole number first.
        n = math.ceil((math.ceil(requested) - p.min) / p.step)
        return p.min + p.step * n
    if p.values:
        return next((v for v in p.values if requested <= v), requested)
    return requested


def violates(consumed: Fraction, cap: Capacity) -> bool:
    p = cap.policy
    if p is None or (p.default is not None and consumed == p.default):
        return False
    if p.min is not None:
        if p.max is not None and consumed > p.max:
            return True
        return p.step is not None and (math.ceil(consumed) - p.min) % p.step != 0
    if p.values:
        return consumed not in p.values
    return False


@dataclass(frozen=True)
class Fit:
    ok: bool
    consumed: dict[str, Fraction]
    # Why not, when not: the capacity it fails on and the kind of failure.
    capacity: str = ""
    why: str = ""  # "missing", "policy", "size" (above the value), "free" (shares hold it)


def fit(
    caps: Mapping[str, Capacity],
    multi: bool,
    requests: Mapping[str, Fraction],
    *,
    held: Mapping[str, Fraction],
) -> Fit:
    for name in requests:
        if name not in caps:
            return Fit(False, {}, name, "missing")
    if not multi:
        for name, amount in requests.items():
            if amount > caps[name].value:
                return Fit(False, {}, name, "size")
        return Fit(True, {})
    consumed = {n: consumption(requests.get(n), c) for n, c in caps.items()}
    for name, cap in caps.items():
        if violates(consumed[name], cap):
            return Fit(False, consumed, name, "policy")
        if consumed[name] > cap.value:
            return Fit(False, consumed, name, "size")
    for name, cap in caps.items():
        if consumed[name] + held.get(name, Fraction(0)) > cap.value:
            return Fit(False, consumed, name, "free")
    return Fit(True, consumed)


def requested(req: Mapping[str, Any]) -> dict[str, Fraction]:
    """A request's `capacity.requests`, parsed; {} when it names none."""
    asked = (req.get("capacity") or {}).get("requests") or {}
    return {str(k): quantity.parse(str(v)) for k, v in asked.items()}

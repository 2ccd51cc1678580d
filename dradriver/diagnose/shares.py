"""What explain says about capacity requests and shared devices (pure): the nearest device
for a request none can take ("the most free memory on any gpu.dradriver.io device is
19.6Gi, on gpu-9b3c2810 of node-a, where 3 shares hold 60Gi"), and each shared device's
consumed and free capacity."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction

from dradriver.api import quantity
from dradriver.diagnose.capacity import Capacity, Fit, consumption
from dradriver.diagnose.world import Published, World

Miss = tuple[Published, Fit]


def _amount(name: str, v: Fraction) -> str:
    # Memory reads in binary units; a count or a percentage as it is.
    return quantity.human(v, binary=name == "memory")


def _where(d: Published) -> str:
    return f"{d.name} of {d.node or d.pool}"


def _range(cap: Capacity) -> str:
    p = cap.policy
    if p is None:
        return f"up to {_amount('', cap.value)}"
    if p.values:
        return "one of " + ", ".join(str(v) for v in p.values)
    parts = [f"from {p.min}" if p.min is not None else ""]
    parts.append(f"to {p.max}" if p.max is not None else f"to {cap.value}")
    if p.step is not None:
        parts.append(f"in steps of {p.step}")
    return " ".join(x for x in parts if x)


def miss_text(
    request: str,
    class_name: str,
    asked: Mapping[str, Fraction],
    *,
    misses: Sequence[Miss],
    w: World,
) -> tuple[str, str]:
    """(message, fix) for a request whose capacity no matching device has free."""
    by_why: dict[str, list[Miss]] = {}
    for m in misses:
        by_why.setdefault(m[1].why, []).append(m)
    what = ", ".join(f"{n} {_amount(n, v)}" for n, v in sorted(asked.items())) or "no capacity"
    if "free" in by_why:
        name = by_why["free"][0][1].capacity
        best, free = None, Fraction(-1)
        for d, _ in by_why["free"]:
            left = d.caps[name].value - w.consumed.get(d.id, {}).get(name, Fraction(0))
            if left > free:
                best, free = d, left
        assert best is not None
        need = by_why["free"][0][1].consumed.get(name, Fraction(0))
        held = w.consumed.get(best.id, {}).get(name, Fraction(0))
        n = len(w.sharers.get(best.id, []))
        return (
            f"request {request} asks for {what}, which takes {_amount(name, need)} of "
            f"{name}; the most free {name} on any {class_name} device is "
            f"{_amount(name, max(free, Fraction(0)))}, on {_where(best)}, where {n} "
            f"share{'s' if n != 1 else ''} hold {_amount(name, held)}",
            f"ask for at most {_amount(name, max(free, Fraction(0)))} of {name}, wait for "
            "shares to be released (or delete their claims), or add GPUs",
        )
    if "size" in by_why:
        name = by_why["size"][0][1].capacity
        d = max((m[0] for m in by_why["size"]), key=lambda d: d.caps[name].value)
        return (
            f"request {request} asks for {what}; the largest {name} of any {class_name} "
            f"device is {_amount(name, d.caps[name].value)} ({_where(d)}"
            + (f", {d.product()}" if d.product() else "")
            + ")",
            f"ask for at most {_amount(name, d.caps[name].value)} of {name}, or for a "
            "device class with larger devices",
        )
    if "policy" in by_why:
        d, f = by_why["policy"][0]
        cap = d.caps[f.capacity]
        took = consumption(asked.get(f.capacity), cap)
        return (
            f"request {request} asks for {what}, which would take {f.capacity} "
            f"{_amount(f.capacity, took)}; {_where(d)} allows a claim {f.capacity} "
            f"{_range(cap)}",
            f"ask for {f.capacity} within that range",
        )
    d, f = misses[0]
    have = ", ".join(sorted(d.caps)) or "none"
    return (
        f"request {request} asks for capacity {f.capacity}, which no {class_name} device "
        f"has ({_where(d)} has {have})",
        "ask only for capacities the devices publish (`dradriver devices` on the node)",
    )


MAX_LINES = 8


def share_lines(devices: Sequence[Published], w: World) -> list[str]:
    """Shared devices, those holding shares first: its shares, and per capacity what they
    hold and what is free; at most MAX_LINES, then how many more."""
    shared = sorted(
        (d for d in devices if d.multi), key=lambda d: (not w.sharers.get(d.id), d.pool, d.name)
    )
    out = []
    for d in shared[:MAX_LINES]:
        held = w.consumed.get(d.id, {})
        claims = w.sharers.get(d.id, [])
        caps = ", ".join(
            f"{n} {_amount(n, held.get(n, Fraction(0)))} of {_amount(n, c.value)}"
            f" ({_amount(n, c.value - held.get(n, Fraction(0)))} free)"
            for n, c in sorted(d.caps.items())
        )
        who = f" ({', '.join(claims[:5])}{' ...' if len(claims) > 5 else ''})" if claims else ""
        out.append(f"{_where(d)}: {len(claims)} shares{who}; {caps}")
    if len(shared) > MAX_LINES:
        out.append(f"and {len(shared) - MAX_LINES} more shared devices")
    return out

"""The nearest miss of a selector that matches nothing: which condition fails everywhere,
and what the devices have instead ("the largest is 79.6Gi (NVIDIA H100 80GB HBM3)")."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

from dradriver.diagnose import quantity, semver
from dradriver.diagnose.cel import CompileError, Selector
from dradriver.diagnose.world import Published

_PATH = re.compile(
    r'device\.(attributes|capacity)\[\s*"([^"]+)"\s*\]\s*(?:\.\s*([A-Za-z_]\w*)|\[\s*"([^"]+)"\s*\])'
)


def conjuncts(expression: str) -> list[str]:
    """The top-level operands of &&, outside parentheses, brackets and string literals."""
    parts, depth, quote, start, i = [], 0, "", 0, 0
    s = expression
    while i < len(s):
        ch = s[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and s.startswith("&&", i):
            parts.append(s[start:i].strip())
            start = i + 2
            i += 1
        i += 1
    parts.append(s[start:].strip())
    return [p for p in parts if p]


def _shown(v: object) -> str:
    if isinstance(v, Fraction):
        return quantity.human(v)
    if isinstance(v, semver.Version):
        return str(v)
    if isinstance(v, str):
        return f'"{v}"'
    return str(v).lower() if isinstance(v, bool) else str(v)


def _values(condition: str, devices: Sequence[Published]) -> str:
    m = _PATH.search(condition)
    if not m:
        return ""
    kind, domain, name = m.group(1), m.group(2), m.group(3) or m.group(4)
    found: list[tuple[object, Published]] = []
    for d in devices:
        table = d.cel.attributes if kind == "attributes" else d.cel.capacity
        if name in table.get(domain, {}):
            found.append((table[domain][name], d))
    what = f"{domain}/{name}"
    if not found:
        return f"no device has {kind[:-1] if kind == 'capacity' else 'attribute'} {what}"
    lacking = f"; {len(devices) - len(found)} lack it" if len(found) < len(devices) else ""
    ordered = [(v, d) for v, d in found if isinstance(v, (int, Fraction, semver.Version))]
    if ordered and len(ordered) == len(found) and not isinstance(ordered[0][0], bool):
        key = (
            (lambda p: _SemverKey(p[0]))
            if isinstance(ordered[0][0], semver.Version)
            else (lambda p: p[0])
        )
        largest = re.search(r">|isGreaterThan", condition) is not None
        smallest = re.search(r"<|isLessThan", condition) is not None
        if largest != smallest:
            v, d = (max if largest else min)(ordered, key=key)
            product = f" ({d.product()})" if d.product() else ""
            which = "largest" if largest else "smallest"
            return f"the {which} {what} is {_shown(v)}{product}{lacking}"
        lo, hi = min(ordered, key=key)[0], max(ordered, key=key)[0]
        return f"{what} ranges from {_shown(lo)} to {_shown(hi)}{lacking}"
    counts = Counter(_shown(v) for v, _ in found)
    seen = ", ".join(f"{v} ({n})" for v, n in counts.most_common(5))
    more = f" and {len(counts) - 5} more" if len(counts) > 5 else ""
    return f"{what} has {seen}{more}{lacking}"


class _SemverKey:
    def __init__(self, v: semver.Version) -> None:
        self.v = v

    def __lt__(self, other: _SemverKey) -> bool:
        return semver.compare(self.v, other.v) < 0


def explain_miss(expression: str, devices: Sequence[Published]) -> tuple[str, str]:
    """(the condition that fails, what the devices have) for a selector none of `devices`
    matches."""
    parts = conjuncts(expression)
    if len(parts) > 1:
        counts = []
        for p in parts:
            try:
                sel = Selector(p)
            except CompileError:  # e.g. a cel.bind() split apart: judge the whole
                return expression, _values(expression, devices)
            n = sum(1 for d in devices if sel.evaluate(d.cel).matches)
            if n == 0:
                return p, _values(p, devices)
            counts.append(f"`{p}` ({n})")
        return expression, "each condition matches some device, none all: " + ", ".join(counts)
    return expression, _values(expression, devices)

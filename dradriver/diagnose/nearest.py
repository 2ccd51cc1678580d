"""The nearest miss of a selector that matches nothing: which condition fails everywhere,
and what the devices have instead ("the largest is 79.6Gi (NVIDIA H100 80GB HBM3)"); and
for a selector that reads a name no device publishes, the published name it most likely
meant ("did you mean productName?")."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from dradriver.api import quantity
from dradriver.api.suggest import nearest
from dradriver.diagnose import semver
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


# How the CEL runtime (and Kubernetes' cel-go, "no such key: x") words a missing map key.
_MISSING_KEY = re.compile(r'(?:Key not found in map\s*:\s*|no such key:\s*)"?([^"\s]+)"?')
_KINDS = ("attributes", "capacity")
_SHOWN_NAMES = 20


@dataclass(frozen=True)
class MissingName:
    """A name a selector reads from `device.<kind>["<domain>"]` that the CEL runtime did
    not find on a device."""

    kind: str  # "attributes" or "capacity"
    domain: str
    name: str
    holders: int  # how many of the published devices have it
    suggestion: str  # the CEL to write instead, "" when nothing published is close
    published: tuple[str, ...]  # the names the domain publishes in that kind

    @property
    def what(self) -> str:
        noun = "attribute" if self.kind == "attributes" else "capacity"
        return f"{noun} {self.domain}/{self.name}"

    def names(self) -> str:
        """The published names, for a message ("architecture, brand, ...")."""
        shown = ", ".join(self.published[:_SHOWN_NAMES])
        more = len(self.published) - _SHOWN_NAMES
        return shown + (f" and {more} more" if more > 0 else "")


def _table(d: Published, kind: str) -> Mapping[str, Mapping[str, object]]:
    return d.cel.attributes if kind == "attributes" else d.cel.capacity


def _names(devices: Sequence[Published], kind: str, domain: str) -> list[str]:
    return sorted({n for d in devices for n in _table(d, kind).get(domain, {})})


def missing_name(expression: str, error: str, published: Sequence[Published]) -> MissingName | None:
    """The name behind a "key not found" CEL error of `expression`, how many of the
    `published` devices have it, and the nearest name they do publish."""
    m = _MISSING_KEY.search(error)
    if not m:
        return None
    key = m.group(1)
    refs = [
        (p.group(1), p.group(2))
        for p in _PATH.finditer(expression)
        if (p.group(3) or p.group(4)) == key
    ]
    if not refs:
        return None
    # The reference that some device lacks: the one the runtime stopped at.
    kind, domain = next(
        (
            (k, dom)
            for k, dom in refs
            if any(key not in _table(d, k).get(dom, {}) for d in published)
        ),
        refs[0],
    )
    holders = sum(1 for d in published if key in _table(d, kind).get(domain, {}))
    names = _names(published, kind, domain)
    return MissingName(
        kind,
        domain,
        key,
        holders,
        _suggest(kind, domain, key, names=names, published=published),
        tuple(names),
    )


def _suggest(
    kind: str, domain: str, key: str, *, names: Sequence[str], published: Sequence[Published]
) -> str:
    """The name itself where it is published (an attribute read as a capacity, or under
    another domain: the name is right, the place is not), else the closest spelling."""
    other = _KINDS[1 - _KINDS.index(kind)]
    if key in _names(published, other, domain):
        return f'device.{other}["{domain}"].{key}'
    domains = sorted({dom for d in published for dom, t in _table(d, kind).items() if key in t})
    place = nearest(domain, domains) or (domains[0] if len(domains) == 1 else None)
    if place:
        return f'device.{kind}["{place}"].{key}'
    close = nearest(key, names)
    return f'device.{kind}["{domain}"].{close}' if close else ""

"""Semantic versions as DRA's `version` attributes and CEL's semver() read them: strict
MAJOR.MINOR.PATCH with optional pre-release and build (semver.org 2.0.0)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
)


class SemverError(ValueError):
    pass


@dataclass(frozen=True)
class Version:
    major: int
    minor: int
    patch: int
    pre: str = ""  # build metadata never takes part in precedence, so it is not kept

    def __str__(self) -> str:
        core = f"{self.major}.{self.minor}.{self.patch}"
        return f"{core}-{self.pre}" if self.pre else core


def parse(text: str, normalize: bool = False) -> Version:
    """`normalize` is semver(s, true): a leading "v" and missing minor/patch are tolerated,
    and leading zeros dropped."""
    s = text
    if normalize:
        s = s.removeprefix("v")
        core, sep, rest = _split(s)
        parts = core.split(".")
        if 1 <= len(parts) <= 3 and all(p.isdigit() for p in parts):
            parts += ["0"] * (3 - len(parts))
            s = ".".join(str(int(p)) for p in parts) + sep + rest
    m = _SEMVER.fullmatch(s) if isinstance(s, str) else None
    if not m:
        raise SemverError(f"{text!r} is not a semantic version such as 1.2.3")
    return Version(int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4) or "")


def _split(s: str) -> tuple[str, str, str]:
    for i, ch in enumerate(s):
        if ch in "-+":
            return s[:i], ch, s[i + 1 :]
    return s, "", ""


def compare(a: Version, b: Version) -> int:
    ka, kb = (a.major, a.minor, a.patch), (b.major, b.minor, b.patch)
    if ka != kb:
        return -1 if ka < kb else 1
    if a.pre == b.pre:
        return 0
    # A pre-release sorts before its release; identifiers compare numerically when both
    # are numeric, numeric before alphanumeric, and a shorter list first on a tie.
    if not a.pre:
        return 1
    if not b.pre:
        return -1
    for x, y in zip(a.pre.split("."), b.pre.split("."), strict=False):
        if x == y:
            continue
        if x.isdigit() and y.isdigit():
            return -1 if int(x) < int(y) else 1
        if x.isdigit() != y.isdigit():
            return -1 if x.isdigit() else 1
        return -1 if x < y else 1
    na, nb = len(a.pre.split(".")), len(b.pre.split("."))
    return (na > nb) - (na < nb)

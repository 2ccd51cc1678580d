"""The suffixes of Kubernetes quantities (k8s.io/apimachinery/pkg/api/resource), in one
table for every parser: the config's byte sizes take the whole ones, `dradriver explain`
all of them, exactly."""

from __future__ import annotations

from fractions import Fraction

# What a size in bytes may carry.
WHOLE: dict[str, int] = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}

# Every suffix, the decimal fractions too ("500m" CPU).
EXACT: dict[str, Fraction] = {
    **{suffix: Fraction(n) for suffix, n in WHOLE.items()},
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
}

# The binary units a size is shown in, largest first.
BINARY: tuple[tuple[str, int], ...] = tuple((s, WHOLE[s]) for s in ("Ei", "Pi", "Ti", "Gi", "Mi"))

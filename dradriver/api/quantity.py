"""Kubernetes quantities as exact fractions, for comparisons the scheduler makes and the
numbers a person reads ("79.6Gi", not 85520809984)."""

from __future__ import annotations

import re
from fractions import Fraction

from dradriver.api.units import BINARY, EXACT

# The grammar of k8s.io/apimachinery/pkg/api/resource: a signed decimal, then a binary
# suffix, a decimal SI suffix or a decimal exponent.
_QUANTITY = re.compile(r"([+-]?)(\d+\.?\d*|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?")


class QuantityError(ValueError):
    pass


def parse(text: str) -> Fraction:
    m = _QUANTITY.fullmatch(text.strip()) if isinstance(text, str) and len(text) <= 64 else None
    if not m:
        raise QuantityError(f"{text!r} is not a quantity such as 80Gi, 500m or 1e3")
    sign, number, suffix = m.group(1), m.group(2), m.group(3) or ""
    scale = Fraction(10) ** int(suffix[1:]) if suffix[:1] in ("e", "E") else EXACT[suffix]
    value = Fraction(number) * scale
    return -value if sign == "-" else value


def human(value: Fraction | int, binary: bool | None = None) -> str:
    """Up to one decimal in the largest binary unit for sizes (79.6Gi); plain otherwise.
    `binary` None guesses: whole numbers of at least 1Mi are sizes."""
    v = Fraction(value)
    if binary is None:
        binary = v.denominator == 1 and abs(v) >= 2**20
    if binary:
        for unit, size in BINARY:
            if abs(v) >= size:
                shown = round(float(v / size), 1)
                return f"{shown:g}{unit}"
    if v.denominator == 1:
        return str(v.numerator)
    return f"{float(v):g}"

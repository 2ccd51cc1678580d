"""The name a typo most likely meant, for messages that say "did you mean X?" (config
fields, request names, attribute names in selectors). Pure."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

# difflib's default: "product" finds "productName", "sharng" finds "sharing", and
# "memoryGB" finds nothing among a GPU's attribute names rather than a wrong guess.
CUTOFF = 0.6


def nearest(word: str, choices: Iterable[str]) -> str | None:
    """The choice closest to `word`: the same name in another case first, then the
    closest spelling; None when nothing is close or `word` is itself a choice."""
    names = list(dict.fromkeys(choices))
    if word in names:
        return None
    folded = {c.lower(): c for c in reversed(names)}  # the first of each spelling wins
    if word.lower() in folded:
        return folded[word.lower()]
    close = difflib.get_close_matches(word.lower(), list(folded), n=1, cutoff=CUTOFF)
    return folded[close[0]] if close else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """ "; did you mean X?" for a message, or "" when nothing is close."""
    best = nearest(word, choices)
    return f"; did you mean {best}?" if best else ""

"""What `dradriver explain` says: a finding (the step that fails, its layer and its fix),
each request's count per node, and the report of a pod or claim. Its own file because
more than explain's walk writes these: missing.py, extended.py and gang.py add findings
of their own, and the command renders the report."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Finding:
    layer: str
    message: str
    fix: str = ""

    def line(self) -> str:
        fix = f" Fix: {self.fix}" if self.fix else ""
        message = self.message.rstrip(" .")
        end = "" if message.endswith("?") else "."  # "did you mean X?" ends the sentence
        return f"{self.layer}: {message}{end}{fix}"


@dataclass
class NodeRow:
    node: str
    published: int = 0
    in_class: int = 0
    matching: int = 0
    taken: int = 0
    counters: int = 0
    tainted: int = 0  # a device taint the request does not tolerate
    short: int = 0  # its capacity (or what its shares leave of it) is too small
    free: int = 0
    usable: int = 0  # free and within a matchAttribute group
    refused: str = ""  # why the pod may not go there (cordon, taint, selector)


@dataclass
class RequestReport:
    claim: str
    request: str
    device_class: str
    count: str
    rows: list[NodeRow] = field(default_factory=list)
    finding: Finding | None = None
    fits_on: list[str] = field(default_factory=list)
    shares: list[str] = field(default_factory=list)  # each shared device that matched


@dataclass
class Report:
    target: str
    requests: list[RequestReport] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    finding: Finding | None = None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["finding"] = self.finding.line() if self.finding else None
        for r, rr in zip(d["requests"], self.requests, strict=True):
            r["finding"] = rr.finding.line() if rr.finding else None
        return d


@dataclass(frozen=True)
class ClaimRef:
    """A claim of the pod (or the claim asked about): the object, or why there is none."""

    name: str  # namespace/name, or the pod's claim entry when there is no object
    obj: Obj | None
    missing: Finding | None = None  # why there is no object (diagnose.missing)

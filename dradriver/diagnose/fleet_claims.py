"""What the fleet's claims say, read from them as the API server returns them: the
requests of the Pending pods' claims that the stranded count (fleet.py) judges the free
GPUs against, and the allocated claims held only for pods that have finished. Its own
file: reading claims and pods is one concern, weighing devices against them another."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dradriver.diagnose import extended
from dradriver.diagnose.capacity import requested
from dradriver.diagnose.cel import CompileError, Selector
from dradriver.diagnose.fleet import DRIVER
from dradriver.diagnose.fleet_report import HeldByFinished, Request
from dradriver.diagnose.world import claim_names

Obj = Mapping[str, Any]
NVLINK = f"{DRIVER}/nvlinkDomain"


def held_by_finished(claims: Sequence[Obj], finished: Sequence[Obj]) -> list[HeldByFinished]:
    """The allocated claims of our devices reserved only for pods that have finished."""
    done = {
        p["metadata"].get("uid"): f"{p['metadata'].get('namespace', '')}/{p['metadata']['name']}"
        for p in finished
        if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed")
    }
    out = []
    for c in claims:
        status = c.get("status") or {}
        results = [
            r
            for r in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
            if r.get("driver") == DRIVER and not r.get("adminAccess")
        ]
        users = status.get("reservedFor") or []
        if not results or not users or not all(u.get("uid") in done for u in users):
            continue
        meta = c["metadata"]
        out.append(
            HeldByFinished(
                f"{meta.get('namespace', '')}/{meta['name']}",
                tuple(sorted(done[u["uid"]] for u in users)),
                str(results[0].get("pool", "")),
                len(results),
                (meta.get("annotations") or {}).get(extended.EXTENDED_CLAIM_ANNOTATION) == "true",
            )
        )
    return sorted(out, key=lambda h: (h.node, h.claim))


def pending_requests(
    pods: Sequence[Obj], claims: Sequence[Obj], classes: Mapping[str, Obj]
) -> tuple[list[Request], list[str]]:
    """The requests of the unallocated claims of pods not bound yet, for our classes."""
    by_name = {(c["metadata"].get("namespace", ""), c["metadata"]["name"]): c for c in claims}
    out: list[Request] = []
    unreadable: list[str] = []
    seen: set[tuple[str, str]] = set()
    for p in pods:
        if (p.get("spec") or {}).get("nodeName"):
            continue
        ns = p["metadata"].get("namespace", "")
        names = claim_names(p)
        todo = [by_name[(ns, n)] for n in names if (ns, n) in by_name and (ns, n) not in seen]
        seen.update((ns, c["metadata"]["name"]) for c in todo)
        # `nvidia.com/gpu: 2` in a container (DRAExtendedResource): the claim the
        # scheduler made for it (among the names), else the one it would make.
        if not (p.get("status") or {}).get("extendedResourceClaimStatus"):
            made_up = extended.plan(p, list(classes.values()), ()).claim
            todo += [made_up] if made_up is not None else []
        for claim in todo:
            if (claim.get("status") or {}).get("allocation"):
                continue
            try:
                out += _requests(claim, classes)
            except CompileError:
                unreadable.append(f"{ns}/{claim['metadata']['name']}")
    return out, unreadable


def _requests(claim: Obj, classes: Mapping[str, Obj]) -> list[Request]:
    devices = (claim.get("spec") or {}).get("devices") or {}
    names = [r.get("name", "") for r in devices.get("requests") or []]
    nvlinked: set[str] = set()
    for c in devices.get("constraints") or []:
        if c.get("matchAttribute") == NVLINK:
            nvlinked |= set(c.get("requests") or names)
    ref = f"{claim['metadata'].get('namespace', '')}/{claim['metadata']['name']}"
    out = []
    for r in devices.get("requests") or []:
        exactly = r.get("exactly") or {}
        cls = classes.get(exactly.get("deviceClassName", ""))
        if cls is None or exactly.get("allocationMode") == "All":
            continue
        exprs = [
            s["cel"]["expression"]
            for s in [
                *((cls.get("spec") or {}).get("selectors") or []),
                *(exactly.get("selectors") or []),
            ]
            if "cel" in s
        ]
        out.append(
            Request(
                ref,
                str(r.get("name", "")),
                int(exactly.get("count", 1)),
                tuple(Selector(e) for e in exprs),
                str(r.get("name", "")) in nvlinked,
                requested(exactly),
            )
        )
    return out

"""Why the devices a request matches are not free for it: held by other claims, blocked
because the GPU they are carved from is in use (its counters), or tainted against it;
with the scheduler's matching of device taints and tolerations, which the per-node count
(explain_request.py) uses too. Its own file: what takes a device is one question, asked
by the count and answered in the finding."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from dradriver.diagnose.explain_report import Finding, NodeRow
from dradriver.diagnose.world import Published, World

Obj = Mapping[str, Any]


def tolerates(toleration: Obj, taint: Obj) -> bool:
    """A DeviceToleration against a DeviceTaint, as the scheduler matches them (an empty
    key with Exists matches every key, an empty effect every effect)."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("key") and toleration["key"] != taint.get("key"):
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return bool(toleration.get("value", "") == taint.get("value", ""))


def untolerated(d: Published, req: Obj) -> Obj | None:
    """The first taint of `d` that keeps request `req` off it."""
    tolerations = req.get("tolerations") or []
    for taint in d.taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def _taint_text(taint: Obj) -> str:
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint.get('key')}{value}:{taint.get('effect')}"


def all_taken(
    request_name: str,
    need: int,
    rows: Sequence[NodeRow],
    *,
    matching: Sequence[Published],
    w: World,
    left: Mapping[tuple[str, str], Any],
    req: Obj,
) -> Finding:
    holders: dict[str, int] = defaultdict(int)
    for d in matching:
        for h in w.holders.get(d.id, []):
            holders[h] += 1
    taken = sum(r.taken for r in rows)
    by_counters = sum(r.counters for r in rows)
    tainted = [(d, t) for d in matching if d.id not in w.holders and (t := untolerated(d, req))]
    if tainted and not taken and not by_counters:
        shown = sorted({f"{d.name} ({_taint_text(t)})" for d, t in tainted})
        more = f" and {len(shown) - 4} more" if len(shown) > 4 else ""
        return Finding(
            "health",
            f"the {len(tainted)} devices matching request {request_name} that are not "
            f"allocated carry a taint it does not tolerate: {', '.join(shown[:4])}{more}",
            "a GPU the driver found unhealthy is tainted until it recovers (reset or "
            "replace it; `dradriver devices` on the node shows why); a job that may use "
            "it tolerates the taint in its request",
        )
    who = ", ".join(f"{h} ({n})" for h, n in sorted(holders.items())[:5])
    more = f" and {len(holders) - 5} more claims" if len(holders) > 5 else ""
    parts = []
    if taken:
        parts.append(f"{taken} allocated to other claims: {who}{more}")
    if by_counters:
        parts.append(
            f"{by_counters} blocked because the GPU they are carved from is used by "
            "devices allocated to other claims"
        )
    if tainted:
        parts.append(f"{len(tainted)} tainted ({_taint_text(tainted[0][1])}, not tolerated)")
    return Finding(
        "allocation",
        f"all {len(matching)} devices matching request {request_name} are taken "
        f"(needs {need} free on one node): " + "; ".join(parts),
        "wait for those claims to be released (or delete them), or add GPUs",
    )

"""What explain and doctor say of the daemons claims depend on (pure): the MPS and IMEX
daemon pods the kubelet plugin runs (kubeletplugin/daemons/), whether each serves, and
which claim's pods lose what when one does not."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dradriver.api import computedomain as cd
from dradriver.diagnose.doctor import Layer, State

Obj = Mapping[str, Any]
# The labels kubeletplugin/daemons/spec.py puts on them.
SELECTOR = "app.kubernetes.io/managed-by=kubelet-plugin"
COMPONENT = "app.kubernetes.io/component"
CLAIM = "dradriver.io/claim-uid"
DEVICE_NAME = "dradriver.io/device-name"
WHAT = {"mps-daemon": "MPS control daemon", "imex-daemon": "IMEX daemon"}


def state(pod: Obj) -> tuple[bool, str]:
    """(whether it serves, what its container is doing)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return False, "being deleted"
    for cs in status.get("containerStatuses") or []:
        st = cs.get("state") or {}
        if "running" in st:
            restarts = int(cs.get("restartCount") or 0)
            return True, "running" + (f", restarted {restarts} times" if restarts else "")
        if st.get("waiting"):
            w = st["waiting"]
            msg = " ".join(str(w.get("message") or "").split())[:160]
            return False, f"{w.get('reason') or 'waiting'}{': ' + msg if msg else ''}"
        if st.get("terminated"):
            t = st["terminated"]
            return False, f"exited {t.get('exitCode')} ({t.get('reason') or 'no reason'})"
    return False, f"{status.get('phase') or 'Pending'}, not started"


def name_of(pod: Obj) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def what(pod: Obj) -> str:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return WHAT.get(str(labels.get(COMPONENT)), "daemon")


def _results(claim: Obj) -> list[Obj]:
    alloc = (claim.get("status") or {}).get("allocation") or {}
    return list((alloc.get("devices") or {}).get("results") or [])


def needs(claim: Obj) -> list[tuple[str, str, str]]:
    """The daemons an allocated claim depends on, as (what, node, label=value that finds
    its pod): an MPS sharing config's, each share's device's, an IMEX channel's."""
    meta = claim.get("metadata") or {}
    alloc = (claim.get("status") or {}).get("allocation") or {}
    out: list[tuple[str, str, str]] = []
    configs = (alloc.get("devices") or {}).get("config") or []
    mps = any(
        ((c.get("opaque") or {}).get("parameters") or {}).get("sharing", {}).get("strategy")
        == "MPS"
        for c in configs
        if isinstance(((c.get("opaque") or {}).get("parameters") or {}).get("sharing"), dict)
    )
    for r in _results(claim):
        node = str(r.get("pool") or "")
        if r.get("shareID") and not r.get("adminAccess"):
            out.append((WHAT["mps-daemon"], node, f"{DEVICE_NAME}={r.get('device')}"))
        elif r.get("device") == cd.CHANNEL_DEVICE:
            out.append((WHAT["imex-daemon"], node, f"{CLAIM}={meta.get('uid')}"))
        elif mps:
            out.append((WHAT["mps-daemon"], node, f"{CLAIM}={meta.get('uid')}"))
    return list(dict.fromkeys(out))


def down(pods: Sequence[Obj], claims: Sequence[Obj]) -> tuple[str, str] | None:
    """explain's finding, (what, fix), for the first daemon the pod's claims depend on
    that has no pod on its node or does not serve; None when all serve."""
    for claim in claims:
        meta = claim.get("metadata") or {}
        whose = f"claim {meta.get('namespace')}/{meta.get('name')}"
        for kind, node, selector in needs(claim):
            key, _, value = selector.partition("=")
            mine = [
                p
                for p in pods
                if (p.get("spec") or {}).get("nodeName") == node
                and ((p.get("metadata") or {}).get("labels") or {}).get(key) == value
            ]
            if not mine:
                return (
                    f"the {kind} {whose} depends on has no pod on {node} (deleted?); the "
                    "claim's containers cannot use it",
                    f"restart the kubelet plugin on {node} (delete its pod): its start makes "
                    "the daemon's pod again; then restart the claim's pods, whose clients "
                    "lost it",
                )
            for pod in mine:
                ok, doing = state(pod)
                if ok:
                    continue
                ns = (pod.get("metadata") or {}).get("namespace")
                name = (pod.get("metadata") or {}).get("name")
                return (
                    f"the {kind} {whose} depends on (pod {ns}/{name} on {node}) is not "
                    f"serving: {doing}; the claim's containers cannot use it until it does",
                    f"`kubectl -n {ns} logs {name}` and `kubectl -n {ns} describe pod {name}` "
                    "say why; the kubelet restarts it by itself; then restart the claim's "
                    "pods, whose clients lost it",
                )
    return None


def layer(node: str, pods: Sequence[Obj]) -> Layer | None:
    """doctor's daemons layer: every daemon pod on the node and whether it serves; None
    when there is none (nothing prepared needs one)."""
    if not pods:
        return None
    said, stuck = [], []
    for pod in sorted(pods, key=name_of):
        ok, doing = state(pod)
        labels = (pod.get("metadata") or {}).get("labels") or {}
        whose = f"claim {labels[CLAIM]}" if CLAIM in labels else "a device's shares"
        said.append(f"{name_of(pod)} ({what(pod)}, {whose}): {doing}")
        if not ok:
            stuck.append(name_of(pod))
    n = len(pods)
    head = f"{n} daemon pod{'s' if n != 1 else ''} on {node}: " + "; ".join(said)
    if not stuck:
        return Layer("daemons", State.OK, head)
    ns, name = stuck[0].split("/", 1)
    return Layer(
        "daemons",
        State.WARN,
        head,
        f"`kubectl -n {ns} describe pod {name}` says why {stuck[0]} does not serve; the "
        "claims it serves cannot use it meanwhile (dradriver explain on one of their pods)",
    )

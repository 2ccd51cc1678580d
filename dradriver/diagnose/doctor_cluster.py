"""doctor's cluster layers: what the API server says of the node, from its objects (the
node's ResourceSlices against what NVML sees, its IMEX channels and clique label, the Node
itself, the DeviceClasses) and the cluster's Kubernetes line and feature gates. Its own
file: these are judged from the API server's answers, the host layers (doctor.py) from
the node's."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from dradriver.diagnose.doctor import Layer, State, plural
from dradriver.k8s import lines

Obj = Mapping[str, Any]
PARTITIONS_GATE = "DRAPartitionableDevices"


def slices(
    driver: str, node: str, published: Sequence[Obj], *, nvml_uuids: set[str] | None
) -> Layer:
    devices = [d for s in published for d in s.get("spec", {}).get("devices", [])]
    if not published:
        return Layer(
            "slices",
            State.FAIL,
            f"no ResourceSlices from {driver} for node {node}.",
            "the plugin publishes them once registered: check the plugin layer and its log "
            "(a DRAPartitionableDevices gate problem is named there)",
        )
    if nvml_uuids is not None:
        seen: set[str] = set()
        for d in devices:
            attrs = d.get("attributes", {})
            for key in ("uuid", "parentUUID"):
                v = attrs.get(key) or attrs.get(f"{driver}/{key}")
                if v and "string" in v:
                    seen.add(str(v["string"]))
        missing = sorted(nvml_uuids - seen)
        if missing:
            return Layer(
                "slices",
                State.FAIL,
                f"{len(missing)} GPU{'' if len(missing) == 1 else 's'} NVML sees "
                f"{'is' if len(missing) == 1 else 'are'} not published "
                f"({', '.join(missing[:3])}).",
                "the plugin republishes on its next rediscovery; send it SIGHUP, or see its "
                "log for GPUs left out (dradriver_gpus_left_out)",
            )
    counted = f"{plural(len(published), 'slice')}, {plural(len(devices), 'device')} published"
    tainted = [(d["name"], t) for d in devices for t in (d.get("taints") or [])[:1]]
    if tainted:
        shown = ", ".join(f"{n} ({t.get('key')}={t.get('value', '')}:{t.get('effect')})"
                          for n, t in tainted[:3])  # fmt: skip
        more = f" and {len(tainted) - 3} more" if len(tainted) > 3 else ""
        return Layer(
            "slices",
            State.WARN,
            f"{counted}; {len(tainted)} tainted, so no new claim gets them: {shown}{more}.",
            "an unhealthy GPU (the driver's <driver>/unhealthy taint): reset or replace "
            "it, the taint goes once the plugin's probes find it healthy; `dradriver "
            "devices` on the node shows why",
        )
    return Layer("slices", State.OK, counted)


def imex(published: Sequence[Obj], node_obj: Obj | None) -> Layer | None:
    """Multi-node NVLink: the node's IMEX channels, its clique label and its IMEX address;
    None for a node whose GPUs are in no fabric clique (nothing to say)."""
    from dradriver.api import computedomain as cd

    devices = [d for s in published for d in s.get("spec", {}).get("devices", [])]

    def attr(d: Obj, key: str) -> Any:
        return (d.get("attributes", {}).get(key) or {}).get("string")

    channels = [d for d in devices if attr(d, "type") == cd.CHANNEL_TYPE]
    cliques = {
        attr(d, "nvlinkDomain") for d in devices if cd.is_fabric_clique(attr(d, "nvlinkDomain"))
    }
    if not cliques:
        return None
    clique = ", ".join(sorted(cliques))
    if not channels:
        return Layer(
            "imex",
            State.WARN,
            f"the GPUs are in fabric clique {clique}, but no IMEX channel device is published: "
            "ComputeDomains cannot use this node",
            "run the plugin with --imex-channels on (driver 570.158.01 or later, with the "
            "nvidia-imex package on the node)",
        )
    meta = (node_obj or {}).get("metadata") or {}
    label = (meta.get("labels") or {}).get(cd.NVLINK_DOMAIN_LABEL)
    if label != clique:
        return Layer(
            "imex",
            State.WARN,
            f"the IMEX channel device is in clique {clique}, but the Node's "
            f"{cd.NVLINK_DOMAIN_LABEL} label is {label or 'missing'}",
            "the plugin sets it after each discovery: its log says why it could not (the "
            "chart grants nodes patch for it)",
        )
    return Layer("imex", State.OK, f"the IMEX channel device is published in clique {clique}")


def node(name: str, obj: Obj | None) -> Layer:
    if obj is None:
        return Layer(
            "node",
            State.FAIL,
            f"there is no Node {name}.",
            "pass --node the name `kubectl get nodes` shows",
        )
    for c in obj.get("status", {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") != "True":
            return Layer(
                "node",
                State.FAIL,
                f"Ready is {c.get('status')} ({c.get('reason', '')}: {c.get('message', '')}).",
                "the kubelet on the node is not reporting: check that it runs",
            )
    if obj.get("spec", {}).get("unschedulable"):
        return Layer(
            "node",
            State.FAIL,
            "cordoned: no new pods are scheduled here.",
            f"kubectl uncordon {name}",
        )
    taints = [
        t for t in obj.get("spec", {}).get("taints") or []
        if t.get("effect") in ("NoSchedule", "NoExecute")
    ]  # fmt: skip
    if taints:
        shown = ", ".join(
            f"{t['key']}{'=' + t['value'] if t.get('value') else ''}:{t['effect']}" for t in taints
        )
        return Layer(
            "node",
            State.WARN,
            f"tainted {shown}: only pods that tolerate it land here.",
            f"add a toleration to GPU pods, or kubectl taint nodes {name} {taints[0]['key']}-",
        )
    return Layer("node", State.OK, "Ready and schedulable")


def device_classes(driver: str, classes: Sequence[Obj]) -> Layer:
    ours = [
        c["metadata"]["name"]
        for c in classes
        if any(driver in json.dumps(s) for s in c.get("spec", {}).get("selectors") or [])
    ]
    if not ours:
        return Layer(
            "deviceclasses",
            State.FAIL,
            f"no DeviceClass selects driver {driver}, so no claim can name its devices.",
            "install them with the Helm chart, or kubectl apply -f deploy/deviceclasses.yaml",
        )
    return Layer("deviceclasses", State.OK, ", ".join(sorted(ours)))


def feature_gates(
    version: str, uses: Collection[str], gates: Mapping[str, bool], *, mig_mode: str | None = None
) -> Layer:
    """The cluster's line and gates against the DRA features the driver has
    (dradriver.k8s.lines): a feature this node uses that is off fails, one it could use
    warns; both name the gate, the components it goes on and the line that has it on by
    default. `uses`: the gates of what the node's plugin is configured for; `gates`: the
    API server's, from its /metrics (empty when not readable: the line's defaults are
    assumed then)."""
    try:
        ln = lines.line(version)
    except lines.LineError as exc:
        return Layer(
            "feature-gates",
            State.FAIL,
            f"{exc}.",
            f"upgrade the control plane to Kubernetes {lines.OLDEST.name} or later",
        )
    if mig_mode == "dynamic":
        uses = {*uses, PARTITIONS_GATE}
    said = "" if gates else " (its /metrics is not readable: the line's defaults assumed)"

    def on(f: lines.Feature) -> bool:
        return gates.get(f.gate, ln.on_by_default(f))

    off = [f for f in lines.FEATURES if not on(f)]
    if not off:
        return Layer(
            "feature-gates",
            State.OK,
            f"Kubernetes {ln.name}: every DRA feature the driver has is on{said}",
        )

    def why(f: lines.Feature) -> str:
        default = "on by default" if ln.on_by_default(f) else "off by default"
        return f"{f.gate} ({f.what}; {default} on {ln.name}, on from 1.{f.on_by_default_from})"

    def fix(fs: Sequence[lines.Feature]) -> str:
        by_where: dict[str, list[str]] = {}
        for f in fs:
            by_where.setdefault(f.components, []).append(f"{f.gate}=true")
        gates_on = "; ".join(f"{','.join(g)} on {where}" for where, g in by_where.items())
        newest = max(f.on_by_default_from for f in fs)
        return f"--feature-gates {gates_on}, or a control plane of Kubernetes 1.{newest} or later"

    needed = [f for f in off if f.gate in uses]
    if needed:
        return Layer(
            "feature-gates",
            State.FAIL,
            f"Kubernetes {ln.name}{said}: this node needs what is off: "
            + "; ".join(why(f) for f in needed),
            fix(needed)
            + (", or run the plugin with --mig-mode static" if PARTITIONS_GATE in uses else ""),
        )
    return Layer(
        "feature-gates",
        State.WARN,
        f"Kubernetes {ln.name}{said}: off here: " + "; ".join(why(f) for f in off),
        fix(off),
    )

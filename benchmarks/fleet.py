"""What the driver's ResourceSlices cost the control plane, fleet-wide.

For each MIG mode (none: whole GPUs; dynamic: every MIG partition as a device, on the
alpha cluster) and each fleet size N, on a fresh local control plane (the real
etcd, kube-apiserver, kube-scheduler and kube-controller-manager of the line $K8S names,
1.34 when unset; the slices laid out for that line) without kubelets:

1. N Node objects, Ready, as a kubelet would register them. The controller-manager runs
   without node-lifecycle-controller, which would mark nodes without heartbeats NotReady;
   the not-ready taint that admission puts on every new node is taken off by hand.
2. Every node's slices (build of its own fake inventory, 8 H100-80GB) published through
   the API the way the plugin publishes them (SlicePublisher.sync, 8 nodes at a time):
   bytes of JSON stored, devices, API requests, wall time, API server and etcd CPU
   seconds (until the watchers have been fed), then API server, etcd and scheduler RSS.
3. Per claim kind (1 GPU; 4 GPUs sharing an NVLink domain; MIG 1g.10gb and 3g.40gb, in
   dynamic mode only) a burst of 200 pods (fewer where the fleet holds fewer), each with
   a ResourceClaim of its own created beforehand: the scheduler's own algorithm time per
   pod (its metrics, read from its secure port with the admin token), its CPU seconds,
   and the wall time from the first pod created to all bound (with a floor under it: the
   scheduler's API client is limited to 50 requests/s by default, and each pod costs it
   three writes: the claim's finalizer, its status, the binding). Every allocation is
   checked: the devices exist on the pod's node and are of the claim's kind, no device
   is in two claims, no counter set is overdrawn (MIG placements do not overlap), the
   four GPUs share an NVLink domain. `--modes none-alpha` runs whole GPUs on the alpha
   cluster: what the alpha gates cost by themselves; `dynamic-chosen` runs dynamic mode
   with only the `--mig-profiles` offered (the plugin's flag of that name).

    .venv/bin/python benchmarks/fleet.py [--nodes 10,50,200,500]
        [--modes none,dynamic,dynamic-chosen] [--mig-profiles 1g.10gb,3g.40gb]

`--modes gb200,imex` publishes GB200 trays (4 GPUs, 18 to a fabric clique) without and
with their IMEX channel device: what the channels cost.

`--modes memory` publishes the same whole GPUs shared by memory (`--consumable-capacity
memory`, on the alpha cluster) and adds a burst of 20Gi shares: what the mode costs in
slice bytes and in the scheduler's time per pod against `none`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import ssl
import sys
import tempfile
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dradriver.api.quantity import parse  # noqa: E402
from dradriver.flags import mig_profiles  # noqa: E402
from dradriver.k8s import Kube, KubeError, NotFound, path_for  # noqa: E402
from dradriver.nvml.library import open_nvml  # noqa: E402
from dradriver.slices.build import MigMode, SliceContent, build  # noqa: E402
from dradriver.slices.consumable import OFF, Consumable, parse_mode  # noqa: E402
from dradriver.slices.imex import channel_slice  # noqa: E402
from dradriver.slices.publish import SlicePublisher, render  # noqa: E402
from dradriver_dev import cluster  # noqa: E402

RES = "resource.k8s.io/v1"
DRIVER = "gpu.dradriver.io"
# Quads rather than the HGX board's single NVSwitch domain: two NVLink islands per node,
# so the 4-GPU claim's matchAttribute constraint has a choice to make and can be broken.
DEVICES = "fake:8xH100-80GB:nvlink=quads"
NODES = (10, 50, 200, 500)
MODES = ("none", "dynamic", "dynamic-chosen")
# Whole GPUs on the alpha cluster: what the alpha gates cost by themselves, apart from the
# slices dynamic mode publishes. Not run unless asked for.
MODES_KNOWN = (*MODES, "none-alpha", "memory", "gb200", "imex")
# `gb200`: GB200 trays (4 GPUs each, 18 to a rack's fabric clique) with whole GPUs;
# `imex`: the same with each tray's IMEX channel device (--imex-channels on) in a slice
# of its own: what the channels cost the API server, etcd and the scheduler.
TRAY = "fake:4xGB200:cluster=rack{rack}"
TRAYS_PER_CLIQUE = 18
# `memory`: whole GPUs shared by memory (--consumable-capacity memory, on the alpha
# cluster); its burst adds 20Gi shares, three to an 80 GB H100.
SHARE = "20Gi"
SHARE_BYTES = 20 * 2**30
# What dynamic-chosen offers: the two profiles the MIG examples ask for.
CHOSEN = "1g.10gb,3g.40gb"
WORKERS = 8  # concurrent API clients: nodes publishing, claims and pods being created
CONTROLLERS = "*,-node-lifecycle-controller"


def mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def in_parallel(fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
    with ThreadPoolExecutor(WORKERS) as pool:
        return list(pool.map(fn, items))


# --- metrics --------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})? (\S+)$", re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse_metrics(text: str, prefix: str) -> Samples:
    out: Samples = defaultdict(float)
    for name, labels, value in _SAMPLE.findall(text):
        if name.startswith(prefix):
            out[(name, frozenset(_LABEL.findall(labels or "")))] += float(value)
    return out


def total(m: Samples, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in m.items() if n == name and want <= ls)


class SchedulerMetrics:
    """The scheduler's /metrics on its secure port. It delegates authentication and
    authorization to the API server, so the kubeconfig's admin token (system:masters)
    is let in; the serving certificate is self-signed."""

    def __init__(self, port: int, kubeconfig: str) -> None:
        doc = yaml.safe_load(Path(kubeconfig).read_text())
        self.url = f"https://127.0.0.1:{port}/metrics"
        self.token = doc["users"][0]["user"]["token"]
        self.ctx = ssl.create_default_context()
        self.ctx.check_hostname = False
        self.ctx.verify_mode = ssl.CERT_NONE

    def read(self) -> Samples:
        req = urllib.request.Request(self.url, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=30, context=self.ctx) as resp:
            return parse_metrics(resp.read().decode(), "scheduler_")


def publish_requests(kube: Kube) -> Counter[str]:
    """Requests the API server has served so far that publishing makes: every request on
    resourceslices, and GETs of nodes (the publisher reads its Node for the owner
    reference). Long-running watches are not requests made by publishing."""
    out: Counter[str] = Counter()
    for (_, labels), v in parse_metrics(kube.text("/metrics"), "apiserver_request_total").items():
        d = dict(labels)
        res, verb = d.get("resource"), d.get("verb", "")
        if verb == "WATCH" or not (res == "resourceslices" or (res == "nodes" and verb == "GET")):
            continue
        dry = " (dry run)" if d.get("dry_run") else ""
        out[f"{verb} {res}{dry}"] += int(v)
    return out


# --- the fleet ------------------------------------------------------------------------


def node_name(i: int) -> str:
    return f"fleet-{i:04d}"


def make_node(kube: Kube, name: str) -> str:
    """A Node as a kubelet registers it, Ready; returns its UID (the slices' owner)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    size = {"cpu": "192", "memory": "2Ti", "pods": "110"}
    node = kube.create(
        path_for("v1", "nodes"),
        {
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                },
            },
            "status": {
                "capacity": size,
                "allocatable": size,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "fleet.py: a node without a kubelet",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
            },
        },
    )
    # Admission taints every new node not-ready; the node lifecycle controller, which
    # would take the taint off, is not running.
    kube.patch(path_for("v1", "nodes", name=name), {"spec": {"taints": None}})
    return str(node["metadata"]["uid"])


@dataclass
class Device:
    type: str
    profile: str | None
    domain: str | None
    consumes: dict[tuple[str, str], int]
    memory: int = 0
    multi: bool = False  # allowMultipleAllocations: shares of it go to several claims


@dataclass
class NodeSlices:
    name: str
    slices: list[SliceContent]
    _devices: dict[str, Device] | None = None
    _capacity: dict[tuple[str, str], int] | None = None

    def _index(self) -> None:
        self._devices, self._capacity = {}, {}
        for s in self.slices:
            for cs in s.shared_counters:
                for c, v in cs["counters"].items():
                    self._capacity[(cs["name"], c)] = int(v["value"])
            for d in s.devices:
                a = d["attributes"]
                self._devices[d["name"]] = Device(
                    type=a["type"]["string"],
                    profile=a.get("profile", {}).get("string"),
                    domain=a.get("nvlinkDomain", {}).get("string"),
                    consumes={
                        (cs["counterSet"], c): int(v["value"])
                        for cs in d.get("consumesCounters", ())
                        for c, v in cs["counters"].items()
                    },
                    memory=int(d.get("capacity", {}).get("memory", {}).get("value", 0)),
                    multi=bool(d.get("allowMultipleAllocations")),
                )

    @property
    def devices(self) -> dict[str, Device]:
        if self._devices is None:
            self._index()
        assert self._devices is not None
        return self._devices

    @property
    def capacity(self) -> dict[tuple[str, str], int]:
        if self._capacity is None:
            self._index()
        assert self._capacity is not None
        return self._capacity


def build_fleet(
    n: int,
    mode: MigMode,
    profiles: frozenset[str] = frozenset(),
    consumable: Consumable = OFF,
    trays: str = "",
) -> list[NodeSlices]:
    """`trays`: "gb200" or "imex" for GB200 trays (with their channels for "imex")."""
    out = []
    for i in range(n):
        devices = TRAY.format(rack=i // TRAYS_PER_CLIQUE) if trays else DEVICES
        inv = open_nvml(devices, node=node_name(i), state_dir=None).discover().inventory
        slices = build(
            inv, mode, profiles=profiles, consumable=consumable, line=cluster.current_line()
        ).slices
        if trays == "imex":
            # The fake's default driver predates IMEX channels; a tray runs 570.158.01+.
            channels, why = channel_slice(dataclasses.replace(inv, driver_version="570.158.1"))
            assert channels is not None, why
            slices = [*slices, channels]
        out.append(NodeSlices(node_name(i), slices))
    return out


# --- claim kinds ----------------------------------------------------------------------


def _example(file: str) -> dict[str, Any]:
    """The claim spec of an examples/claims template: what users are told to write."""
    for doc in yaml.safe_load_all((REPO / "examples" / "claims" / file).read_text()):
        if doc["kind"] == "ResourceClaimTemplate":
            return dict(doc["spec"]["spec"])
    raise ValueError(f"{file}: no ResourceClaimTemplate")


@dataclass
class Kind:
    name: str
    spec: dict[str, Any]
    type: str
    count: int = 1
    profile: str | None = None
    same_domain: bool = False
    share: int = 0  # bytes of memory a share asks for; 0: not a share

    def fits(self, d: Device) -> bool:
        return d.type == self.type and (self.profile is None or d.profile == self.profile)

    def capacity(self, node: NodeSlices) -> int:
        """How many of these claims one node holds (greedy, by counters where published)."""
        fitting = [d for d in node.devices.values() if self.fits(d)]
        if fitting and fitting[0].multi:
            # What the 1.34 scheduler places on a node of shared GPUs: it checks the
            # capacity left on the slice's first device, whichever device it places
            # (kubernetes/kubernetes#133705, fixed in 1.35), so a node takes shares until
            # its first GPU is full, and one claim that takes whole GPUs.
            return fitting[0].memory // self.share if self.share else 1
        if self.same_domain:
            per: Counter[str | None] = Counter(
                d.domain for d in node.devices.values() if self.fits(d) and d.domain
            )
            return sum(v // self.count for v in per.values())
        used: Counter[tuple[str, str]] = Counter()
        n = 0
        for d in node.devices.values():
            if self.fits(d) and all(used[k] + v <= node.capacity[k] for k, v in d.consumes.items()):
                used.update(d.consumes)
                n += 1
        return n // self.count


def kinds(
    mode: MigMode, profiles: frozenset[str] = frozenset(), consumable: Consumable = OFF
) -> list[Kind]:
    gpu = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}
    out = [
        Kind("1 GPU", gpu, "gpu"),
        Kind("4 NVLinked GPUs", _example("four-nvlinked-gpus.yaml"), "gpu", 4, same_domain=True),
    ]
    if consumable.on:
        out.append(
            Kind(f"{SHARE} share", _example("gpu-share-by-memory.yaml"), "gpu", share=SHARE_BYTES)
        )
    if mode is MigMode.DYNAMIC:
        out += [
            Kind(f"MIG {p}", _example(f"mig-{p.replace('.', '')}.yaml"), "mig", profile=p)
            for p in ("1g.10gb", "3g.40gb")
            if not profiles or p in profiles
        ]
    return out


def check(
    kind: Kind, claims: list[dict[str, Any]], pods: dict[str, str], fleet: dict[str, NodeSlices]
) -> list[str]:
    """Every wrong allocation, in words. `pods`: claim name -> the node its pod is bound to."""
    wrong: list[str] = []
    holder: dict[tuple[str, str], str] = {}
    used: Counter[tuple[str, str, str]] = Counter()
    memory: Counter[tuple[str, str]] = Counter()  # bytes the shares of a device consume
    for c in claims:
        name = c["metadata"]["name"]
        results = c.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
        if not results:
            wrong.append(f"{name}: not allocated")
            continue
        if len(results) != kind.count:
            wrong.append(f"{name}: {len(results)} devices, not {kind.count}")
        domains = set()
        for r in results:
            pool, dev = r["pool"], r["device"]
            node = fleet.get(pool)
            d = node.devices.get(dev) if node else None
            if r["driver"] != DRIVER or node is None or d is None:
                wrong.append(f"{name}: {r['driver']}/{pool}/{dev} is not a published device")
                continue
            if pool != pods.get(name):
                wrong.append(f"{name}: device on {pool}, pod on {pods.get(name)}")
            if not kind.fits(d):
                wrong.append(f"{name}: {dev} is a {d.type} {d.profile or ''}, not {kind.name}")
            if d.multi:
                if not r.get("shareID"):
                    wrong.append(f"{name}: {pool}/{dev} is shared, but the result has no shareID")
                memory[(pool, dev)] += int(
                    parse((r.get("consumedCapacity") or {}).get("memory", "0"))
                )
            elif (pool, dev) in holder:
                wrong.append(f"{name}: {pool}/{dev} also in {holder[pool, dev]}")
            holder[(pool, dev)] = name
            domains.add(d.domain)
            for (cs, ctr), v in d.consumes.items():
                used[(pool, cs, ctr)] += v
        if kind.same_domain and (len(domains) != 1 or None in domains):
            wrong.append(f"{name}: GPUs in NVLink domains {sorted(map(str, domains))}")
    for (pool, cs, ctr), v in used.items():
        if v > fleet[pool].capacity[(cs, ctr)]:
            wrong.append(f"{pool}: counter set {cs} overdrawn ({ctr}: {v})")
    for (pool, dev), v in memory.items():
        if v > fleet[pool].devices[dev].memory:
            wrong.append(f"{pool}/{dev}: its shares consume {v} bytes of memory, more than it has")
    return wrong


# --- one run --------------------------------------------------------------------------


@dataclass
class Publish:
    slices: int = 0
    devices: int = 0
    bytes: int = 0
    requests: Counter[str] = field(default_factory=Counter)
    wall: float = 0.0
    api_cpu: float = 0.0
    etcd_cpu: float = 0.0
    rss: dict[str, float] = field(default_factory=dict)


@dataclass
class Burst:
    kind: str
    pods: int
    bound: int = 0
    wall: float = 0.0
    algorithm: float = 0.0  # mean seconds per scheduling attempt
    attempts: dict[str, int] = field(default_factory=dict)
    extension: dict[str, float] = field(default_factory=dict)  # mean seconds per call
    sched_cpu: float = 0.0
    api_cpu: float = 0.0
    wrong: list[str] = field(default_factory=list)


def publish(kube: Kube, st: cluster.ClusterState, fleet: list[NodeSlices]) -> Publish:
    made = in_parallel(lambda n: make_node(kube, n.name), fleet)
    uids = {n.name: uid for n, uid in zip(fleet, made, strict=True)}
    out = Publish()
    # The bytes stored: render() is exactly what the plugin writes, plus its owner reference.
    for n in fleet:
        owner = [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": n.name,
                "uid": uids[n.name],
                "controller": True,
            }
        ]
        for obj in render(DRIVER, n.name, n.slices):
            obj["metadata"]["ownerReferences"] = owner
            out.bytes += len(json.dumps(obj, separators=(",", ":")))
            out.devices += len(obj["spec"].get("devices") or [])
            out.slices += 1
    api, etcd = st.pids["kube-apiserver"], st.pids["etcd"]
    time.sleep(2)  # let the node creation's own work settle out of the CPU figures
    r0, a0, e0 = publish_requests(kube), cpu_seconds(api), cpu_seconds(etcd)
    t = time.perf_counter()
    in_parallel(lambda n: SlicePublisher(kube, DRIVER, n.name).sync(n.slices), fleet)
    out.wall = time.perf_counter() - t
    # The API server goes on feeding the watchers (scheduler, controller-manager) after
    # the last write returned: wait until it is idle again.
    last = cpu_seconds(api)
    while True:
        time.sleep(1)
        now = cpu_seconds(api)
        if now - last < 0.1:
            break
        last = now
    out.api_cpu, out.etcd_cpu = cpu_seconds(api) - a0, cpu_seconds(etcd) - e0
    out.requests = publish_requests(kube) - r0
    for name in ("kube-apiserver", "etcd", "kube-scheduler", "kube-controller-manager"):
        out.rss[name] = rss_mib(st.pids[name])
    return out


def wait_for(what: str, ok: Callable[[], bool], timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > end:
            raise RuntimeError(f"no {what} in {timeout:.0f}s")
        time.sleep(0.2)


def burst(
    kube: Kube,
    st: cluster.ClusterState,
    sched: SchedulerMetrics,
    kind: Kind,
    n: int,
    fleet: dict[str, NodeSlices],
    ns: str,
) -> Burst:
    kube.create(path_for("v1", "namespaces"), {"metadata": {"name": ns}})

    def sa() -> bool:
        try:
            kube.get(path_for("v1", "serviceaccounts", ns, name="default"))
            return True
        except NotFound:
            return False

    wait_for(f"default ServiceAccount in {ns}", sa)  # admission refuses pods without it
    claims = path_for(RES, "resourceclaims", ns)
    in_parallel(
        lambda i: kube.create(claims, {"metadata": {"name": f"c{i}"}, "spec": kind.spec}),
        range(n),
    )
    out = Burst(kind.name, n)
    pods = path_for("v1", "pods", ns)

    def pod(i: int) -> dict[str, Any]:
        ref = kind.spec["devices"]["requests"][0]["name"]
        return {
            "metadata": {"name": f"p{i}"},
            "spec": {
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 0,
                "resourceClaims": [{"name": ref, "resourceClaimName": f"c{i}"}],
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"claims": [{"name": ref}]},
                    }
                ],
            },
        }

    sched_pid, api = st.pids["kube-scheduler"], st.pids["kube-apiserver"]
    rv = kube.list(pods)["metadata"]["resourceVersion"]
    bound: set[str] = set()
    m0, s0, a0 = sched.read(), cpu_seconds(sched_pid), cpu_seconds(api)
    t = time.perf_counter()
    with ThreadPoolExecutor(WORKERS) as pool:
        created = [pool.submit(kube.create, pods, pod(i)) for i in range(n)]
        # A watch, not polling: listing the pods again and again would bill the API
        # server for the measuring.
        end = time.monotonic() + max(120.0, 2.0 * n)
        while len(bound) < n and time.monotonic() < end:
            left = int(end - time.monotonic()) + 1
            try:
                for ev in kube.watch(pods, resource_version=rv, timeout_seconds=left):
                    obj = ev["object"]
                    rv = obj["metadata"]["resourceVersion"]
                    if ev["type"] in ("ADDED", "MODIFIED") and obj["spec"].get("nodeName"):
                        bound.add(obj["metadata"]["name"])
                        if len(bound) == n:
                            break
            except KubeError:  # the watch broke or its resourceVersion expired: list again
                items = kube.list(pods)
                rv = items["metadata"]["resourceVersion"]
                bound |= {
                    p["metadata"]["name"] for p in items["items"] if p["spec"].get("nodeName")
                }
        out.wall = time.perf_counter() - t
        for f in created:
            f.result()
    m1, s1, a1 = sched.read(), cpu_seconds(sched_pid), cpu_seconds(api)
    out.sched_cpu, out.api_cpu = s1 - s0, a1 - a0
    alg = "scheduler_scheduling_algorithm_duration_seconds"
    calls = total(m1, alg + "_count") - total(m0, alg + "_count")
    out.algorithm = (total(m1, alg + "_sum") - total(m0, alg + "_sum")) / max(calls, 1)
    for result in ("scheduled", "unschedulable", "error"):
        a = "scheduler_schedule_attempts_total"
        out.attempts[result] = int(total(m1, a, result=result) - total(m0, a, result=result))
    ext = "scheduler_framework_extension_point_duration_seconds"
    for point in ("PreFilter", "Filter", "Score", "Reserve", "PreBind", "Bind"):
        c = total(m1, ext + "_count", extension_point=point)
        c -= total(m0, ext + "_count", extension_point=point)
        s = total(m1, ext + "_sum", extension_point=point)
        s -= total(m0, ext + "_sum", extension_point=point)
        out.extension[point] = s / c if c else 0.0

    bound_to = {
        p["spec"]["resourceClaims"][0]["resourceClaimName"]: p["spec"].get("nodeName", "")
        for p in kube.list(pods)["items"]
    }
    out.bound = sum(1 for v in bound_to.values() if v)
    out.wrong = check(kind, kube.list(claims)["items"], bound_to, fleet)
    if out.bound < n:
        out.wrong.insert(0, f"{n - out.bound} of {n} pods not bound in time")
    clean(kube, ns)
    return out


def clean(kube: Kube, ns: str) -> None:
    """Pods go at once (no kubelet to wait for); claims lose the scheduler's finalizer so
    that their devices are free for the next burst without waiting on controllers."""
    pods, claims = path_for("v1", "pods", ns), path_for(RES, "resourceclaims", ns)
    kube.delete_collection(pods, gracePeriodSeconds=0)
    wait_for("pods deleted", lambda: not kube.list(pods, limit=1)["items"])
    kube.delete_collection(claims)

    def strip(c: dict[str, Any]) -> None:
        if c["metadata"].get("finalizers"):
            with contextlib.suppress(NotFound):
                kube.patch(
                    path_for(RES, "resourceclaims", ns, name=c["metadata"]["name"]),
                    {"metadata": {"finalizers": None}},
                )

    in_parallel(strip, kube.list(claims)["items"])
    wait_for("claims deleted", lambda: not kube.list(claims, limit=1)["items"])
    kube.delete(path_for("v1", "namespaces", name=ns), missing_ok=True)


@dataclass
class Result:
    mode: str
    nodes: int
    build: float
    publish: Publish
    bursts: list[Burst]
    total: float


def run(mode: str, n: int, pods: int, work: Path, chosen: frozenset[str]) -> Result:
    t0 = time.perf_counter()
    consumable = parse_mode("memory") if mode == "memory" else OFF
    trays = mode if mode in ("gb200", "imex") else ""
    mig = MigMode(
        "none" if consumable.on or trays else mode.removesuffix("-alpha").removesuffix("-chosen")
    )
    alpha = mig is MigMode.DYNAMIC or mode.endswith("-alpha") or consumable.on
    profiles = chosen if mode.endswith("-chosen") else frozenset()
    label = f"dynamic, {','.join(sorted(profiles))}" if profiles else mode
    print(f"fleet: {label} x {n} nodes: building each node's slices", flush=True)
    t = time.perf_counter()
    fleet = build_fleet(n, mig, profiles, consumable, trays)
    built = time.perf_counter() - t
    st = cluster.up(work / f"{mode}-{n}", alpha=alpha, controllers=CONTROLLERS)
    try:
        kube = Kube.from_kubeconfig(st.kubeconfig)
        print(f"fleet: {label} x {n}: publishing", flush=True)
        pub = publish(kube, st, fleet)
        print(publish_row(label, n, pub), flush=True)
        sched = SchedulerMetrics(st.ports["scheduler"], st.kubeconfig)
        by_name = {x.name: x for x in fleet}
        bursts = []
        for i, kind in enumerate(kinds(mig, profiles, consumable)):
            size = min(pods, kind.capacity(fleet[0]) * n)
            b = burst(kube, st, sched, kind, size, by_name, f"burst-{i}")
            bursts.append(b)
            print(burst_row(label, n, b), flush=True)
            for w in b.wrong[:10]:
                print(f"    WRONG: {w}", flush=True)
    finally:
        cluster.down(work / f"{mode}-{n}")
    return Result(label, n, built, pub, bursts, time.perf_counter() - t0)


# --- output ---------------------------------------------------------------------------

PUBLISH_HEAD = (
    "| mode | nodes | slices | devices | MiB stored | requests | publish wall s "
    "| apiserver CPU s | etcd CPU s | RSS apiserver / etcd / scheduler MiB |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)
BURST_HEAD = (
    "| mode | nodes | claim kind | pods | bound in s | pods/s | algorithm ms/pod "
    "| Filter ms/pod | scheduler CPU ms/pod | wrong |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def publish_row(mode: str, n: int, p: Publish) -> str:
    return (
        f"| {mode} | {n} | {p.slices} | {p.devices} | {mib(p.bytes)} | "
        f"{sum(p.requests.values())} | {p.wall:.1f} | {p.api_cpu:.1f} | {p.etcd_cpu:.1f} | "
        f"{p.rss['kube-apiserver']:.0f} / {p.rss['etcd']:.0f} / {p.rss['kube-scheduler']:.0f} |"
    )


def burst_row(mode: str, n: int, b: Burst) -> str:
    return (
        f"| {mode} | {n} | {b.kind} | {b.pods} | {b.wall:.1f} | {b.bound / b.wall:.1f} | "
        f"{b.algorithm * 1000:.1f} | {b.extension['Filter'] * 1000:.1f} | "
        f"{b.sched_cpu / b.pods * 1000:.0f} | {len(b.wrong)} |"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default=",".join(map(str, NODES)), help="fleet sizes, e.g. 10,50")
    ap.add_argument(
        "--modes",
        default=",".join(MODES),
        help="MIG modes: none,dynamic,dynamic-chosen (only --mig-profiles offered); "
        "none-alpha: whole GPUs on the alpha cluster; memory: whole GPUs shared by memory; "
        "gb200, imex: GB200 trays without and with their IMEX channels",
    )
    ap.add_argument(
        "--mig-profiles",
        default=CHOSEN,
        help=f"the profiles dynamic-chosen offers (default {CHOSEN})",
    )
    ap.add_argument("--pods", type=int, default=200, help="pods per burst (capped by capacity)")
    args = ap.parse_args()
    sizes = [int(x) for x in args.nodes.split(",") if x]
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES_KNOWN:
            ap.error(f"--modes: {m!r} is not one of {', '.join(MODES_KNOWN)}")
    chosen = mig_profiles(args.mig_profiles)
    if not chosen and "dynamic-chosen" in modes:
        ap.error("--mig-profiles: dynamic-chosen needs at least one profile")
    work = Path(tempfile.mkdtemp(prefix="drfleet-"))
    print(f"fleet: control planes in {work}; {DEVICES} per node", flush=True)
    results = []
    t = time.perf_counter()
    for n in sizes:
        for mode in modes:
            try:
                r = run(mode, n, args.pods, work, chosen)
            except (KubeError, RuntimeError, cluster.ClusterError) as exc:
                print(f"fleet: {mode} x {n} failed: {exc}", flush=True)
                continue
            results.append(r)
            print(
                f"fleet: {mode} x {n} took {r.total:.0f} s (building the slices {r.build:.1f} s)",
                flush=True,
            )
    work.rmdir()  # each run's state went with its control plane
    print(f"\nfleet: all runs took {time.perf_counter() - t:.0f} s\n")
    print(PUBLISH_HEAD)
    for r in results:
        print(publish_row(r.mode, r.nodes, r.publish))
    print()
    print(BURST_HEAD)
    for r in results:
        for b in r.bursts:
            print(burst_row(r.mode, r.nodes, b))
    print()
    for r in results:
        reqs = ", ".join(f"{k} {v}" for k, v in sorted(r.publish.requests.items()) if v)
        print(f"{r.mode} x {r.nodes}: publish requests: {reqs}")
        for b in r.bursts:
            ext = ", ".join(f"{k} {v * 1000:.2f}" for k, v in b.extension.items())
            print(
                f"  {b.kind}: attempts {b.attempts}; extension points ms/call: {ext}; "
                f"apiserver CPU {b.api_cpu:.1f} s"
            )
    wrong = sum(len(b.wrong) for r in results for b in r.bursts)
    print(f"\nwrong allocations: {wrong}")
    return 1 if wrong or len(results) < len(sizes) * len(modes) else 0


if __name__ == "__main__":
    sys.exit(main())

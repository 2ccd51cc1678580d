"""`dradriver doctor`, the pure part: each layer of a GPU node judged from facts the
command gathered, bottom-up, as a line that is ok or names the fault and its fix."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from dradriver.k8s import lines

Obj = Mapping[str, Any]
PARTITIONS_GATE = "DRAPartitionableDevices"


class State(Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "FAIL"
    SKIP = "skip"


@dataclass(frozen=True)
class Layer:
    name: str
    state: State
    text: str
    fix: str = ""

    def line(self) -> str:
        text = self.text.rstrip(" .") + ("." if self.fix else "")
        fix = f" Fix: {self.fix}" if self.fix else ""
        return f"{self.state.value:<4}  {self.name}: {text}{fix}"


def nvml(spec: str | None, versions: tuple[str, str, int] | None, error: str) -> Layer:
    """`versions`: (driver, CUDA, GPUs) when NVML answered."""
    if spec is None:
        return Layer("nvml", State.SKIP, "not on the node (pass --devices nvml to check it here)")
    if versions is None:
        return Layer("nvml", State.FAIL, f"NVML does not answer: {error}.", nvml_fix(error))
    driver, cuda, gpus = versions
    fake = " (fake devices)" if spec.startswith("fake:") else ""
    if gpus == 0:
        return Layer(
            "nvml",
            State.FAIL,
            f"driver {driver} answers but sees no GPU{fake}.",
            "check the GPUs are visible to the driver (nvidia-smi -L) and not held by vfio",
        )
    many = "" if gpus == 1 else "s"
    return Layer("nvml", State.OK, f"driver {driver}, CUDA {cuda}, {gpus} GPU{many}{fake}")


def nvml_fix(error: str) -> str:
    """The fix for an NVML that does not answer, from its error."""
    low = error.lower()
    if "mismatch" in low or "different versions" in low:
        return (
            "the kernel module and libnvidia-ml differ in version: reboot, or reload "
            "the nvidia module, after a driver upgrade"
        )
    if "libnvidia-ml" in low or "not found" in low or "shared library" in low:
        return (
            "install the NVIDIA driver on the node, or point the plugin at its root "
            "(Helm driverRoot) when it lives elsewhere (e.g. /run/nvidia/driver)"
        )
    return "check that the NVIDIA driver is loaded (nvidia-smi on the node)"


def cdi(
    cdi_dir: str,
    writable_error: str | None,
    runtime: tuple[str, str] | None,
    *,
    runtime_reads: str = "",
) -> Layer:
    """`runtime`: (path, text) of containerd's config when readable; `runtime_reads`:
    where there is no containerd, what says the runtime reads `cdi_dir` (a dev node's)."""
    if writable_error is not None:
        return Layer(
            "cdi",
            State.FAIL,
            f"{cdi_dir} is not writable: {writable_error}.",
            "mount the CDI directory read-write into the plugin (Helm cdiDir), or pass "
            "--cdi-dir a writable directory the runtime reads",
        )
    if runtime is None:
        said = runtime_reads or "runtime CDI setting not readable here"
        return Layer("cdi", State.OK, f"{cdi_dir} writable; {said}")
    path, text = runtime
    verdict = containerd_cdi(text, cdi_dir)
    if verdict:
        return Layer(
            "cdi",
            State.FAIL,
            f"{path}: {verdict}.",
            "set enable_cdi = true (and cdi_spec_dirs to include "
            f"{cdi_dir}) in containerd's CRI plugin section, then restart containerd",
        )
    return Layer("cdi", State.OK, f"{cdi_dir} writable; containerd has CDI on ({path})")


def driver_files(mode: str, release: str, path: str, *, spec: Mapping[str, Any] | None) -> Layer:
    """The node's driver spec (--driver-files cdi): there, and for the driver NVML
    reports (`release`; "" when NVML did not answer). `spec`: its parsed JSON, if any."""
    if mode == "runtime":
        return Layer(
            "driver-files",
            State.OK,
            "runtime: NVIDIA's container runtime (legacy mode) is to add the driver's files",
        )
    if spec is None:
        return Layer(
            "driver-files",
            State.FAIL,
            f"no driver spec at {path}: containers get device nodes and no driver.",
            "the plugin writes it at start and at each rediscovery; its log says why not "
            "(`driver spec not written`): usually driverRoot is not where the driver is",
        )
    devices = spec.get("devices") or [{}]
    env = (devices[0].get("containerEdits") or {}).get("env") or []
    written = next(
        (e.split("=", 1)[1] for e in env if e.startswith("DRADRIVER_DRIVER_VERSION=")), ""
    )
    if release and written != release:
        return Layer(
            "driver-files",
            State.FAIL,
            f"{path} is for driver {written or '?'}, NVML reports {release}.",
            "the plugin rewrites it at its next rediscovery: send it SIGHUP, or restart it",
        )
    edits = spec.get("containerEdits") or {}
    hooks = sorted({h.get("path", "?") for h in edits.get("hooks") or []})
    return Layer(
        "driver-files",
        State.OK,
        f"{path}: driver {written}, {_n(len(edits.get('mounts') or []), 'file')}, hooks "
        f"by {', '.join(hooks) or 'none'}",
    )


def containerd_cdi(text: str, cdi_dir: str) -> str:
    """Empty when containerd's config turns CDI on and reads our directory."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return f"not valid TOML ({exc})"
    plugins = doc.get("plugins", {})
    # containerd 2 (config version 3) has CDI on by default; 1.7 (version 2) has it off.
    default_on = int(doc.get("version", 1)) >= 3
    sections = [
        plugins.get("io.containerd.cri.v1.runtime", {}),
        plugins.get("io.containerd.grpc.v1.cri", {}),
    ]
    enabled = next((s["enable_cdi"] for s in sections if "enable_cdi" in s), default_on)
    if not enabled:
        return "CDI is off in containerd (enable_cdi is not true)"
    dirs = next((s["cdi_spec_dirs"] for s in sections if "cdi_spec_dirs" in s), None)
    if dirs is not None and cdi_dir.rstrip("/") not in [d.rstrip("/") for d in dirs]:
        return f"containerd reads CDI specs from {', '.join(dirs)}, not {cdi_dir}"
    return ""


# The order /readyz's failing checks are named in: what the others depend on first. The
# API server before the registration: a plugin that cannot reach it is broken whatever
# the kubelet says, while a registration under way only needs a few seconds.
READYZ_ORDER = ("discovery", "api", "checkpoint", "registration", "slices")


def registration(url: str, code: int, body: str, *, dev_log: str = "") -> Layer:
    """From the plugin's /readyz (code 0: no answer). `dev_log`: the log of a dev node's
    plugin (a host process, not a pod)."""
    if code == 0:
        fix = (
            f"start the dev node's plugin again (make demo KEEP=1); why it stopped is in {dev_log}"
            if dev_log
            else "check the plugin pod on this node (kubectl -n <ns> get pods -o wide -l "
            "app.kubernetes.io/component=kubelet-plugin) and its log"
        )
        return Layer(
            "plugin", State.FAIL, f"the kubelet plugin does not answer at {url} ({body}).", fix
        )
    try:
        checks = json.loads(body)
    except ValueError:
        return Layer("plugin", State.FAIL, f"{url} answered {code}: {body[:200]}.")
    failing = {k: v for k, v in checks.items() if not v.get("ok")}
    order = READYZ_ORDER
    for name in sorted(failing, key=lambda n: order.index(n) if n in order else len(order)):
        detail = str(failing[name].get("detail", ""))
        return Layer("plugin", State.FAIL, f"/readyz {name}: {detail}.", readyz_fix(name, detail))
    return Layer("plugin", State.OK, "running and registered with the kubelet (/readyz ok)")


def readyz_fix(check: str, detail: str) -> str:
    """The fix for one failing /readyz check, naming the layer that failed."""
    low = detail.lower()
    if check == "registration":
        if "does not watch" in detail:
            return ""  # the detail already names the directory and the flag
        if "refused" in detail:
            return "the kubelet's reason is above; check the driver name and kubelet version"
        return (
            "wait a few seconds; if it stays, the kubelet does not see the registration "
            "socket: check --kubelet-dir (Helm kubeletDir) against the kubelet's --root-dir"
        )
    if check == "discovery":
        return "the plugin's NVML layer: " + nvml_fix(detail)
    if check == "api":
        return api_fix(detail)
    if check == "checkpoint":
        if "not loaded yet" in low:
            return "the plugin is starting: run doctor again in a few seconds"
        return ""  # the refusal names the checkpoint and what to do
    if check == "slices":
        if "403" in detail or "forbidden" in low:
            return (
                "the plugin may not write its ResourceSlices: check the RBAC of its "
                "ServiceAccount (create, update, delete resourceslices) and the own-node "
                "ResourceSlice admission policy (Helm installs both)"
            )
        if "not published yet" in low:
            return "the plugin is starting: run doctor again in a few seconds"
        return (
            "publishing the node's ResourceSlices fails for the reason above; see the plugin's log"
        )
    return f"the plugin's {check} check fails for the reason above; see the plugin's log"


def api_fix(detail: str) -> str:
    """From the plugin's own API probe (ops/api_probe.py says which answer it got)."""
    low = detail.lower()
    if "not checked yet" in low:
        # A plugin older than this doctor probes on the first /readyz only.
        return "the plugin had not probed the API server yet: run doctor again"
    if "refused the plugin's credentials" in low or "(401" in detail or "no credentials" in low:
        return (
            "the API server rejects the plugin's credentials: check its ServiceAccount token "
            "(the pod's mounted token; recreate the pod after the ServiceAccount was "
            "recreated) or the token or client certificate in its --kubeconfig"
        )
    if "forbids" in low or "(403" in detail:
        return (
            "the plugin's identity lacks RBAC: check the ClusterRole and ClusterRoleBinding "
            "of its ServiceAccount grant list on resourceslices (Helm installs them)"
        )
    if "not answering" in low or "cannot reach" in low or "unreachable" in low:
        return (
            "the plugin cannot reach the API server: check the network from the node to "
            "it and the address the plugin uses (its --kubeconfig's server, or "
            "KUBERNETES_SERVICE_HOST in a pod)"
        )
    return "the API server's answer to the plugin is above; see the plugin's log"


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
    counted = f"{_n(len(published), 'slice')}, {_n(len(devices), 'device')} published"
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


def dev_summary(nodes: Sequence[tuple[str, Layer | None]]) -> str:
    """The last line of a dev cluster's walk: each node with its first broken layer."""
    bad = [(name, layer) for name, layer in nodes if layer is not None]
    checked = f"{len(nodes)} dev node{'' if len(nodes) == 1 else 's'} checked"
    if not bad:
        return f"{checked}: every layer of each is ok"
    named = ", ".join(f"{name} ({layer.name})" for name, layer in bad)
    return f"{checked}: {len(bad)} broken: {named}; each one's fix is on its FAIL line above"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"

"""`dradriver doctor`, the pure part: each layer of a GPU node judged from facts the
command gathered, bottom-up, as a line that is ok or names the fault and its fix."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

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
        low = error.lower()
        if "mismatch" in low:
            fix = (
                "the kernel module and libnvidia-ml differ in version: reboot, or reload "
                "the nvidia module, after a driver upgrade"
            )
        elif "libnvidia-ml" in low or "not found" in low or "shared library" in low:
            fix = (
                "install the NVIDIA driver on the node, or point the plugin at its root "
                "(Helm driverRoot) when it lives elsewhere (e.g. /run/nvidia/driver)"
            )
        else:
            fix = "check that the NVIDIA driver is loaded (nvidia-smi on the node)"
        return Layer("nvml", State.FAIL, f"NVML does not answer: {error}.", fix)
    driver, cuda, gpus = versions
    fake = " (fake devices)" if spec.startswith("fake:") else ""
    if gpus == 0:
        return Layer(
            "nvml",
            State.FAIL,
            f"driver {driver} answers but sees no GPU{fake}.",
            "check the GPUs are visible to the driver (nvidia-smi -L) and not held by vfio",
        )
    return Layer("nvml", State.OK, f"driver {driver}, CUDA {cuda}, {gpus} GPUs{fake}")


def cdi(cdi_dir: str, writable_error: str | None, runtime: tuple[str, str] | None) -> Layer:
    """`runtime`: (path, text) of containerd's config when readable."""
    if writable_error is not None:
        return Layer(
            "cdi",
            State.FAIL,
            f"{cdi_dir} is not writable: {writable_error}.",
            "mount the CDI directory read-write into the plugin (Helm cdiDir), or pass "
            "--cdi-dir a writable directory the runtime reads",
        )
    if runtime is None:
        return Layer("cdi", State.OK, f"{cdi_dir} writable; runtime CDI setting not readable here")
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


def registration(url: str, code: int, body: str) -> Layer:
    """From the plugin's /readyz (code 0: no answer)."""
    if code == 0:
        return Layer(
            "plugin",
            State.FAIL,
            f"the kubelet plugin does not answer at {url} ({body}).",
            "check the plugin pod on this node (kubectl -n <ns> get pods -o wide -l "
            "app.kubernetes.io/component=kubelet-plugin) and its log",
        )
    try:
        checks = json.loads(body)
    except ValueError:
        return Layer("plugin", State.FAIL, f"{url} answered {code}: {body[:200]}.")
    failing = {k: v for k, v in checks.items() if not v.get("ok")}
    order = ("discovery", "checkpoint", "registration", "api", "slices")
    for name in sorted(failing, key=lambda n: order.index(n) if n in order else len(order)):
        detail = str(failing[name].get("detail", ""))
        return Layer("plugin", State.FAIL, f"/readyz {name}: {detail}.", _readyz_fix(name, detail))
    return Layer("plugin", State.OK, "running and registered with the kubelet (/readyz ok)")


def _readyz_fix(check: str, detail: str) -> str:
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
        return "see the nvml layer: run doctor on the node with --devices"
    if check == "api":
        return "the plugin cannot reach the API server: check the network and its token"
    if check == "checkpoint":
        return ""
    return "see the plugin's log"


def slices(driver: str, node: str, published: Sequence[Obj], nvml_uuids: set[str] | None) -> Layer:
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
                f"{len(missing)} GPUs NVML sees are not published ({', '.join(missing[:3])}).",
                "the plugin republishes on its next rediscovery; send it SIGHUP, or see its "
                "log for GPUs left out (dradriver_gpus_left_out)",
            )
    counted = f"{len(published)} slices, {len(devices)} devices published"
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


def feature_gates(mig_mode: str | None, gates: Mapping[str, bool]) -> Layer:
    if not gates:
        return Layer("feature-gates", State.SKIP, "the API server's /metrics is not readable")
    if mig_mode == "dynamic" and gates.get(PARTITIONS_GATE) is False:
        return Layer(
            "feature-gates",
            State.FAIL,
            f"dynamic MIG mode needs {PARTITIONS_GATE}, which is off on the API server.",
            f"enable {PARTITIONS_GATE} on kube-apiserver, kube-scheduler and "
            "kube-controller-manager, or run the plugin with --mig-mode static",
        )
    on = [g for g in ("DynamicResourceAllocation", PARTITIONS_GATE) if gates.get(g)]
    return Layer("feature-gates", State.OK, "on: " + (", ".join(on) or "none of interest"))

"""doctor's cluster layers from the API server's objects as plain values: the node's
slices, the Node, the DeviceClasses, the feature gates and IMEX."""

from __future__ import annotations

from dradriver.diagnose import doctor_cluster as judge
from dradriver.diagnose.doctor import State
from dradriver.k8s.lines import FEATURES

D = "gpu.dradriver.io"


def gpu(uuid: str) -> dict[str, object]:
    return {"name": "gpu-0", "attributes": {"uuid": {"string": uuid}}}


def test_slices_layer_compares_with_nvml() -> None:
    assert judge.slices(D, "n1", [], nvml_uuids=None).state is State.FAIL
    published = [{"spec": {"devices": [gpu("GPU-a")]}}]
    assert judge.slices(D, "n1", published, nvml_uuids={"GPU-a"}).state is State.OK
    stale = judge.slices(D, "n1", published, nvml_uuids={"GPU-a", "GPU-b"})
    assert stale.state is State.FAIL and "GPU-b" in stale.line() and "SIGHUP" in stale.line()


def test_slices_layer_warns_of_unhealthy_gpus() -> None:
    sick = {**gpu("GPU-a"), "taints": [{"key": f"{D}/unhealthy", "value": "xid-79",
                                        "effect": "NoSchedule"}]}  # fmt: skip
    layer = judge.slices(D, "n1", [{"spec": {"devices": [sick, gpu("GPU-b")]}}], nvml_uuids=None)
    assert layer.state is State.WARN
    assert f"1 tainted, so no new claim gets them: {sick['name']} ({D}/unhealthy=xid-79:" in (
        layer.line()
    )
    assert "reset or replace it" in layer.line()


def test_node_layer() -> None:
    assert "pass --node" in judge.node("n1", None).line()
    cordoned = judge.node("n1", {"spec": {"unschedulable": True}})
    assert cordoned.line() == (
        "FAIL  node: cordoned: no new pods are scheduled here. Fix: kubectl uncordon n1"
    )
    tainted = judge.node("n1", {"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}})
    assert tainted.state is State.WARN and "kubectl taint nodes n1 k-" in tainted.line()
    not_ready = {"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}
    assert "kubelet" in judge.node("n1", not_ready).line()
    assert judge.node("n1", {"spec": {}}).state is State.OK


def test_device_classes_and_gates() -> None:
    ours = {"metadata": {"name": D}, "spec": {"selectors": [{"cel": {"expression": D}}]}}
    other = {"metadata": {"name": "x"}, "spec": {"selectors": [{"cel": {"expression": "1"}}]}}
    assert judge.device_classes(D, [ours, other]).line() == f"ok    deviceclasses: {D}"
    assert "deploy/deviceclasses.yaml" in judge.device_classes(D, [other]).line()


def test_feature_layer_names_what_the_line_or_its_gates_lack_and_the_fix() -> None:
    all_on = {f.gate: True for f in FEATURES}
    for version in ("v1.36.3", "v1.37.2"):  # on by default: nothing to turn on
        layer = judge.feature_gates(version, set(), {}, mig_mode="dynamic")
        assert layer.state is State.OK and "every DRA feature" in layer.line(), layer.line()
    assert judge.feature_gates("v1.34.4", set(), all_on, mig_mode="dynamic").state is State.OK
    # Off where dynamic MIG needs it: the gate, its components, and the line that has it.
    off = {**all_on, "DRAPartitionableDevices": False}
    layer = judge.feature_gates("v1.34.4", set(), off, mig_mode="dynamic")
    assert layer.state is State.FAIL
    assert "DRAPartitionableDevices=true on kube-apiserver, kube-scheduler" in layer.fix
    assert "Kubernetes 1.36 or later" in layer.fix and "--mig-mode static" in layer.fix
    # Not needed by this node: a warning that names it and its fix.
    layer = judge.feature_gates("v1.34.4", set(), off, mig_mode="static")
    assert layer.state is State.WARN and "DRAPartitionableDevices (dynamic MIG" in layer.text
    # Gates not readable: the line's defaults, said so.
    layer = judge.feature_gates("v1.35.4", {"DRAConsumableCapacity"}, {}, mig_mode=None)
    assert layer.state is State.FAIL and "not readable" in layer.text
    assert "DRAConsumableCapacity (shares of a GPU by memory" in layer.text
    assert "ResourceHealthStatus" not in layer.fix  # only what this node needs
    # A 1.36 cluster that turned a default off is judged by its gates.
    layer = judge.feature_gates(
        "v1.36.3", {"DRAConsumableCapacity"}, {"DRAConsumableCapacity": False}
    )
    assert layer.state is State.FAIL and "on by default on 1.36" in layer.text
    layer = judge.feature_gates("v1.33.7", set(), all_on)
    assert layer.state is State.FAIL and "upgrade the control plane" in layer.fix


def test_imex_layer_names_missing_channels_and_a_wrong_label() -> None:
    from dradriver.diagnose.doctor_cluster import imex

    clique = "a1b2c3d4-0000-4000-8000-000000000001.1"
    gpu = {
        "name": "gpu-0",
        "attributes": {"type": {"string": "gpu"}, "nvlinkDomain": {"string": clique}},
    }
    channel = {
        "name": "channel-0",
        "attributes": {"type": {"string": "imex-channel"}, "nvlinkDomain": {"string": clique}},
    }
    hgx = {"name": "gpu-1", "attributes": {"nvlinkDomain": {"string": "nvlink-42b5fb7b9bc0"}}}
    assert imex([{"spec": {"devices": [hgx]}}], None) is None
    layer = imex([{"spec": {"devices": [gpu]}}], None)
    assert layer is not None and layer.state is State.WARN and "--imex-channels on" in layer.fix
    labelled = {"metadata": {"labels": {"gpu.dradriver.io/nvlink-domain": clique}}}
    layer = imex([{"spec": {"devices": [gpu, channel]}}], {"metadata": {}})
    assert layer is not None and layer.state is State.WARN and "label is missing" in layer.text
    layer = imex([{"spec": {"devices": [gpu, channel]}}], labelled)
    assert layer is not None and layer.state is State.OK
    assert layer.line() == f"ok    imex: the IMEX channel device is published in clique {clique}"

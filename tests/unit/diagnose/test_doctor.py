"""doctor's judgement of each layer from plain facts: one line, ok or the fault and fix."""

from __future__ import annotations

import json

from dradriver.diagnose import doctor as judge
from dradriver.diagnose.doctor import State
from dradriver.k8s import KubeError
from dradriver.k8s.lines import FEATURES
from dradriver.kubeletplugin.endpoints.api_probe import describe

D = "gpu.dradriver.io"


def test_nvml_layer() -> None:
    assert judge.nvml(None, None, "").state is State.SKIP
    ok = judge.nvml("nvml", ("570.86.15", "12.8.0", 8), "")
    assert ok.line() == "ok    nvml: driver 570.86.15, CUDA 12.8.0, 8 GPUs"
    missing = judge.nvml("nvml", None, "libnvidia-ml.so.1 was not found.")
    assert missing.state is State.FAIL and "install the NVIDIA driver" in missing.line()
    mismatch = judge.nvml("nvml", None, "Driver/library version mismatch")
    assert "reboot, or reload the nvidia module" in mismatch.line()
    assert judge.nvml("nvml", ("570.1.0", "12.8.0", 0), "").state is State.FAIL


CONTAINERD_17_OFF = """
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  enable_cdi = false
"""
CONTAINERD_17_ON = """
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
"""
CONTAINERD_2 = """
version = 3
[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = ["/etc/cdi"]
"""


def test_cdi_layer_reads_containerds_setting() -> None:
    assert judge.cdi("/var/run/cdi", "Read-only file system", None).state is State.FAIL
    assert judge.cdi("/var/run/cdi", None, None).state is State.OK
    off = judge.cdi("/var/run/cdi", None, ("/etc/containerd/config.toml", CONTAINERD_17_OFF))
    assert off.state is State.FAIL and "CDI is off in containerd" in off.line()
    assert "enable_cdi = true" in off.line()
    assert judge.cdi("/var/run/cdi", None, ("c", CONTAINERD_17_ON)).state is State.OK
    # containerd 1.7 defaults to off, 2.x to on.
    assert judge.containerd_cdi("version = 2\n", "/var/run/cdi")
    other_dir = judge.containerd_cdi(CONTAINERD_2, "/var/run/cdi")
    assert other_dir == "containerd reads CDI specs from /etc/cdi, not /var/run/cdi"
    assert judge.containerd_cdi("version = [", "/x").startswith("not valid TOML")


def test_driver_files_layer() -> None:
    from dradriver.kubeletplugin.prepare.cdi import driver_spec

    path = f"/var/run/cdi/{D}-driver.json"
    lib = "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"
    edits = {
        "mounts": [{"hostPath": lib, "containerPath": lib}],
        "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook"}],
    }
    spec = driver_spec(D, "580.95.05", edits)
    ok = judge.driver_files("cdi", "580.95.05", path, spec=spec)
    assert ok.line() == (
        f"ok    driver-files: {path}: driver 580.95.05, 1 file, hooks by /usr/bin/nvidia-cdi-hook"
    )
    stale = judge.driver_files("cdi", "590.44.01", path, spec=spec)
    assert stale.state is State.FAIL and "NVML reports 590.44.01" in stale.line()
    assert "SIGHUP" in stale.line()
    missing = judge.driver_files("cdi", "580.95.05", path, spec=None)
    assert missing.state is State.FAIL and "driverRoot" in missing.line()
    assert judge.driver_files("runtime", "580.95.05", path, spec=None).state is State.OK


def readyz(**checks: tuple[bool, str]) -> str:
    return json.dumps({k: {"ok": ok, "detail": d} for k, (ok, d) in checks.items()})


def test_plugin_layer_from_readyz() -> None:
    url = "http://127.0.0.1:8081/readyz"
    down = judge.registration(url, 0, "Connection refused")
    assert down.state is State.FAIL and "does not answer" in down.line()
    waiting = judge.registration(
        url, 503, readyz(registration=(False, "waiting for the kubelet"), api=(True, "ok"))
    )
    assert "registration: waiting for the kubelet" in waiting.line()
    assert "--kubelet-dir" in waiting.line()
    # Discovery fails first when both do: the lower layer is the cause.
    both = judge.registration(
        url, 503, readyz(registration=(False, "x"), discovery=(False, "NVML layer: gone"))
    )
    assert "/readyz discovery: NVML layer: gone" in both.line()
    assert judge.registration(url, 200, readyz(registration=(True, "registered"))).state is State.OK


HOST = "https://10.0.0.1:6443"


def api_failure(error: KubeError) -> str:
    """/readyz as a plugin whose API probe got `error` answers it."""
    return readyz(
        discovery=(True, "ok"),
        registration=(False, "waiting for the kubelet"),
        api=(False, describe(HOST, error)),
        slices=(False, str(error)),
    )


def test_the_fix_for_a_failed_api_probe_names_what_failed() -> None:
    """401: the credentials, 403: RBAC, no answer: the network and the address. The API
    is named before a registration still under way: it does not fix itself."""
    url = "http://127.0.0.1:8081/readyz"
    cases = {
        KubeError(401, "Unauthorized", "Unauthorized"): "rejects the plugin's credentials",
        KubeError(0, "NoCredentials", "token file gone"): "rejects the plugin's credentials",
        KubeError(403, "Forbidden", "cannot list resourceslices"): "lacks RBAC",
        KubeError(0, "Unreachable", "connection refused"): "cannot reach the API server",
    }
    for error, fix in cases.items():
        layer = judge.registration(url, 503, api_failure(error))
        assert layer.state is State.FAIL and layer.line().startswith("FAIL  plugin: /readyz api:")
        assert fix in layer.fix, layer.line()
    hung = readyz(api=(False, f"the API server at {HOST} is not answering for 4 s"))
    assert "check the network from the node" in judge.registration(url, 503, hung).fix
    # An older plugin's first answer is not a verdict on the API server.
    old = judge.registration(url, 503, readyz(api=(False, "not checked yet")))
    assert old.fix == "the plugin had not probed the API server yet: run doctor again"


def test_a_failing_readyz_check_other_than_the_api_names_its_own_layer() -> None:
    url = "http://127.0.0.1:8081/readyz"

    def fix(**checks: tuple[bool, str]) -> str:
        return judge.registration(url, 503, readyz(**checks)).fix

    nvml = fix(discovery=(False, "NVML layer: libnvidia-ml.so.1 was not found"))
    assert nvml.startswith("the plugin's NVML layer: install the NVIDIA driver on the node")
    rbac = fix(slices=(False, "kubernetes API: 403 Forbidden: cannot create resourceslices"))
    assert rbac.startswith("the plugin may not write its ResourceSlices: check the RBAC")
    starting = fix(checkpoint=(False, "not loaded yet"))
    assert starting == "the plugin is starting: run doctor again in a few seconds"
    other = fix(gpus=(False, "something new"))
    assert other.startswith("the plugin's gpus check fails")


def test_a_stopped_dev_node_plugin_points_at_its_log() -> None:
    layer = judge.registration("http://127.0.0.1:1/readyz", 0, "refused", dev_log="/x/n-plugin.log")
    assert "start the dev node's plugin again" in layer.fix and "/x/n-plugin.log" in layer.fix
    assert "kubectl" not in layer.fix  # a dev node's plugin is no pod


def test_dev_cluster_summary() -> None:
    bad = judge.Layer("cdi", State.FAIL, "gone", "mount it")
    assert judge.dev_summary([("a", None), ("b", None)]) == (
        "2 dev nodes checked: every layer of each is ok"
    )
    assert judge.dev_summary([("a", None), ("b", bad)]).startswith(
        "2 dev nodes checked: 1 broken: b (cdi)"
    )
    hollow = judge.cdi("/d/cdi", None, None, runtime_reads="the hollow node's runtime resolves it")
    assert hollow.line() == "ok    cdi: /d/cdi writable; the hollow node's runtime resolves it"


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
    from dradriver.diagnose.doctor import imex

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

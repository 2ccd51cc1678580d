"""doctor's judgement of each layer from plain facts: one line, ok or the fault and fix.
Here the host layers (NVML, the driver's files, CDI) and a dev cluster's summary."""

from __future__ import annotations

from dradriver.diagnose import doctor as judge
from dradriver.diagnose.doctor import State

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

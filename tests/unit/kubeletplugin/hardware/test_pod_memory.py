"""A share's memory as its pods' cgroup GPU-memory limit (Q9 item 3, NVIDIA's MPS v3 memory
partitioning through nvmlDeviceSetMemoryLimits_v1): the pure parts (where the kubelet keeps
a pod's cgroup, what each pod may hold on each GPU), the fake NVML's rules for the two
functions, and prepare over the fake node with a cgroup tree standing for the host's: each
pod's limit bounds all of its processes together, a pod holding two shares of a GPU gets
both, and nothing here is ever fatal to a share, which keeps its MPS limits."""

from __future__ import annotations

import json
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dradriver.errors import SharingError
from dradriver.inventory.node_devices import MigMode
from dradriver.kubeletplugin.hardware.pod_memory import find_pod_cgroup, is_pod_dir
from dradriver.kubeletplugin.prepare.claim_status import _entry
from dradriver.kubeletplugin.prepare.plan import ClaimRef
from dradriver.kubeletplugin.state.files import from_json, to_json
from dradriver.kubeletplugin.state.pod_limits import PodLimit, pod_totals, wanted
from dradriver.kubeletplugin.state.records import (
    PREPARE_COMPLETED,
    ClaimRecord,
    PreparedDevice,
    Share,
)
from dradriver.nvml.memory_limits import get_memory_limit, set_memory_limit
from dradriver.slices.consumable import parse_mode
from fakenvml import dmem, load
from fakenvml.mps_v3 import Client, CudaError
from tests.support.gpu_names import names_of, real
from tests.support.local_daemons import LocalDaemons
from tests.support.node import DRIVER, NODE, fake_preparer

GI = 2**30
UID = "6f1c2d3e-aaaa-bbbb-cccc-0123456789ab"
SPEC_615 = 'driverVersion: "615.71.09"\ngpus:\n  - product: H100-80GB\n  - product: H100-80GB\n'


# -- where the kubelet keeps a pod's cgroup ------------------------------------------------


@pytest.mark.parametrize(
    "rel",
    [
        f"kubepods/pod{UID}",  # cgroupfs, Guaranteed
        f"kubepods/burstable/pod{UID}",
        f"kubepods/besteffort/pod{UID}",
        f"kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice",  # systemd
        "kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{UID.replace('-', '_')}.slice",
        # kind's nodes: the kubelet runs with --cgroup-root=/kubelet and systemd.
        "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
        f"kubelet-kubepods-besteffort-pod{UID.replace('-', '_')}.slice",
    ],
)
def test_a_pods_cgroup_is_found_under_either_cgroup_driver(tmp_path: Path, rel: str) -> None:
    (tmp_path / "system.slice" / f"pod{UID}").mkdir(parents=True)  # not the kubelet's
    (tmp_path / rel / "container-1").mkdir(parents=True)
    assert find_pod_cgroup(tmp_path, UID) == tmp_path / rel


def test_no_cgroup_for_another_pod_or_outside_the_kubelets_tree(tmp_path: Path) -> None:
    other = str(uuidlib.uuid4())
    (tmp_path / "kubepods" / "burstable" / f"pod{other}").mkdir(parents=True)
    (tmp_path / "user.slice" / f"pod{UID}").mkdir(parents=True)
    assert find_pod_cgroup(tmp_path, UID) is None
    assert find_pod_cgroup(tmp_path / "missing", UID) is None
    assert not is_pod_dir(f"pod{UID}x", UID)


# -- what each pod may hold on each GPU (pure) ---------------------------------------------


def _rec(uid: str, *devs: tuple[str, str, int | None, tuple[str, ...]]) -> ClaimRecord:
    devices = [
        PreparedDevice(
            request_names=["gpu"],
            pool=NODE,
            device=f"dev-{uuid}",
            cdi_device_ids=[],
            uuid=uuid,
            kind=kind,
            share=Share(f"s-{uid}-{i}", memory_limit=memory, pods=pods),
        )
        for i, (uuid, kind, memory, pods) in enumerate(devs)
    ]
    return ClaimRecord(uid, "team", uid, PREPARE_COMPLETED, devices, updated_at=0.0)


def test_a_pods_limit_on_a_gpu_is_all_of_its_shares_there() -> None:
    first = _rec("c1", ("GPU-a", "gpu", 20 * GI, ("p1",)))
    second = _rec("c2", ("GPU-a", "gpu", 10 * GI, ("p1", "p2")), ("GPU-b", "gpu", 4 * GI, ("p1",)))
    others = pod_totals([first])
    assert wanted(second, others) == [
        PodLimit("GPU-a", "p1", 30 * GI),
        PodLimit("GPU-a", "p2", 10 * GI),
        PodLimit("GPU-b", "p1", 4 * GI),
    ]
    # MIG devices (NVML limits no MIG handle) and shares without memory set nothing.
    assert (
        wanted(_rec("c3", ("MIG-x", "mig", GI, ("p1",)), ("GPU-a", "gpu", None, ("p1",))), {}) == []
    )


def test_the_share_record_keeps_pods_and_cgroups_and_reads_an_older_one() -> None:
    s = Share("s1", memory_limit=GI, pods=("p1",), pod_cgroups=("/sys/fs/cgroup/x",))
    assert from_json(Share, to_json(s), "share") == s
    older = {"shareID": "s1", "consumed": {}, "memoryLimit": GI}
    assert from_json(Share, older, "share") == Share("s1", memory_limit=GI)


# -- the fake NVML's rules -------------------------------------------------------------------


def _fake(tmp: Path, driver: str = "615.71.09") -> tuple[Any, str, Path, str]:
    fake = load("1xH100-80GB", node="n", driver_version=driver)
    nvml = fake.pynvml
    nvml.nvmlInit()
    gpu = fake.machine.gpus[0]
    region = dmem.region(gpu.layout.pci.legacy_bus_id)
    root = tmp / "cgroup"
    dmem.make_hierarchy(root, {region: 80 * GI})
    pod = root / "kubepods" / f"pod{UID}"
    dmem.make_cgroup(pod)
    return nvml, gpu.uuid, pod, region


def test_fake_sets_and_reads_a_cgroups_limit_as_dmem_max_and_min(tmp_path: Path) -> None:
    nvml, gpu, pod, region = _fake(tmp_path)
    assert get_memory_limit(nvml, gpu, str(pod)).hard is None
    set_memory_limit(nvml, gpu, str(pod), soft=8 * GI, hard=20 * GI)
    assert dmem.limits(pod, region) == (8 * GI, 20 * GI, 0)
    assert (pod / "dmem.max").read_text() == f"{region} {20 * GI}\n"
    got = get_memory_limit(nvml, gpu, str(pod))
    assert (got.soft, got.hard, got.used) == (8 * GI, 20 * GI, 0)
    # Cleared as NVML documents: soft 0, hard NVML_DEVICE_MEMORY_LIMIT_MAX.
    set_memory_limit(nvml, gpu, str(pod), soft=0, hard=nvml.NVML_DEVICE_MEMORY_LIMIT_MAX)
    assert dmem.limits(pod, region) == (0, None, 0)


def test_fake_refuses_as_the_driver_documents(tmp_path: Path) -> None:
    nvml, gpu, pod, _ = _fake(tmp_path)
    cases = [
        (str(pod / "missing"), "cgroup_not_found"),
        ("/sys/fs/cgroup", "memory_limits_unsupported"),  # never the host's own
        (str(tmp_path), "memory_limits_unsupported"),  # no dmem region registered
    ]
    for path, reason in cases:
        with pytest.raises(SharingError) as e:
            set_memory_limit(nvml, gpu, path, soft=0, hard=GI)
        assert e.value.reason == reason, path
    with pytest.raises(SharingError, match="Invalid Argument"):
        set_memory_limit(nvml, gpu, str(pod), soft=2 * GI, hard=GI)
    old, gpu_old, pod_old, _ = _fake(tmp_path / "old", driver="570.86.15")
    with pytest.raises(SharingError) as e:
        get_memory_limit(old, gpu_old, str(pod_old))
    assert e.value.reason == "memory_limits_missing"


def test_fake_refuses_a_mig_handle(tmp_path: Path) -> None:
    fake = load("1xA100-40GB:mig=on", node="n", driver_version="615.71.09")
    nvml = fake.pynvml
    nvml.nvmlInit()
    # A hierarchy the whole GPU could be limited in: only the MIG handle is refused.
    dmem.make_hierarchy(tmp_path, {dmem.region(fake.machine.gpus[0].layout.pci.legacy_bus_id): GI})
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, nvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE)
    gi = nvml.nvmlDeviceCreateGpuInstance(h, info.id)
    ci_info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi,
        nvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
        nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
    )
    nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    limits = nvml.c_nvmlSetMemoryLimits_v1_t(nameSpace=str(tmp_path).encode(), hardLimit=GI)
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceSetMemoryLimits_v1(mig, limits)
    nvml.nvmlDeviceSetMemoryLimits_v1(h, limits)


# -- prepare over the fake node --------------------------------------------------------------


class CgroupNode:
    """A node with two fake H100s on an r615 driver, consumable memory mode, and a cgroup
    v2 tree with dmem where the "kubelet" makes each pod's cgroup before prepare."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.spec = tmp / "gpus.yaml"
        self.spec.write_text(SPEC_615)
        self.root = tmp / "cgroup"
        self.claims: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, str] = {}
        # The kernel registers each GPU's region when the driver loads.
        machine = load(f"@{self.spec}", node=NODE).machine
        dmem.make_hierarchy(self.root, {self.region(g): 80 * GI for g in machine.gpus})
        self.start()

    def start(self) -> None:
        self.driver, self.nvml = fake_preparer(
            self.tmp,
            f"@{self.spec}",
            lambda ref: self.claims[ref.name],
            mode=MigMode.NONE,
            consumable=parse_mode("memory"),
            mps_protocol=3,
            cgroup_root=self.root,
        )
        self.names = names_of(self.driver.devices())

    def pod(self, name: str, qos: str = "besteffort", make: bool = True) -> str:
        uid = str(uuidlib.uuid4())
        self.pods[name] = uid
        if make:
            dmem.make_cgroup(self.cgroup(name, qos))
        return uid

    def cgroup(self, pod: str, qos: str = "besteffort") -> Path:
        return (
            self.root
            / "kubepods.slice"
            / f"kubepods-{qos}.slice"
            / (f"kubepods-{qos}-pod{self.pods[pod].replace('-', '_')}.slice")
        )

    def share(self, name: str, memory: str, *pods: str, device: str = "gpu-0") -> ClaimRef:
        uid = str(uuidlib.uuid4())
        self.claims[name] = {
            "metadata": {"uid": uid, "namespace": "team", "name": name},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "gpu",
                                "driver": DRIVER,
                                "pool": NODE,
                                "device": real(device, self.names),
                                "shareID": str(uuidlib.uuid4()),
                                "consumedCapacity": {"memory": memory},
                            }
                        ]
                    }
                },
                "reservedFor": [{"resource": "pods", "name": p, "uid": self.pods[p]} for p in pods],
            },
        }
        ref = ClaimRef("team", uid, name)
        assert self.driver.prepare([ref])[ref.uid].error == ""
        return ref

    def env(self, ref: ClaimRef) -> dict[str, str]:
        spec = json.loads((self.tmp / "cdi" / f"{DRIVER}-claim-{ref.uid}.json").read_text())
        (dev,) = spec["devices"]
        return dict(e.split("=", 1) for e in dev["containerEdits"]["env"])

    def process(self, ref: ClaimRef, pod: str, container: str = "main") -> Client:
        """A CUDA process of `pod`'s container using the claim's share."""
        cg = self.cgroup(pod) / f"cri-containerd-{container}.scope"
        dmem.make_cgroup(cg)
        e = self.env(ref)
        gpu = self.nvml.backend.machine.gpus[0]
        return Client(Path(e["CUDA_MPS_PIPE_DIRECTORY"]), e, cgroup=cg, region=self.region(gpu))

    @staticmethod
    def region(gpu: Any) -> str:
        return dmem.region(gpu.layout.pci.legacy_bus_id)

    def limit(self, pod: str, gpu: int = 0) -> int | None:
        return dmem.limits(self.cgroup(pod), self.region(self.nvml.backend.machine.gpus[gpu]))[1]

    def record(self, ref: ClaimRef) -> ClaimRecord:
        return self.driver.store.load().claims[ref.uid]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[CgroupNode]:
    """The shares start real (fake) MPS daemons: stopped after the test, even one that
    fails, rather than left running."""
    n = CgroupNode(tmp_path)
    yield n
    LocalDaemons(tmp_path).stop_all()  # never leave a daemon behind, even when a test fails


def test_each_pods_cgroup_is_limited_to_its_share_across_its_processes(node: CgroupNode) -> None:
    node.pod("a")
    node.pod("b")
    a = node.share("a", "20Gi", "a")
    b = node.share("b", "20Gi", "b")
    assert node.limit("a") == node.limit("b") == 20 * GI
    (d,) = node.record(a).devices
    assert d.share is not None and d.share.pod_cgroups == (str(node.cgroup("a")),)
    assert _entry(DRIVER, d, "now")["data"]["enforcedBy"] == ["mps-namespace", "pod-cgroup"]
    # Two processes of pod a: each under the namespace's per-process 20Gi, but the pod's
    # cgroup holds them to 20Gi together.
    first, second = node.process(a, "a", "main"), node.process(a, "a", "sidecar")
    first.allocate(15 * GI)
    with pytest.raises(CudaError, match=r"dmem\.max"):
        second.allocate(6 * GI)
    second.allocate(5 * GI)
    # Pod b's share on the same GPU is untouched by a's.
    node.process(b, "b").allocate(20 * GI)


def test_a_pod_with_two_shares_of_a_gpu_gets_both(node: CgroupNode) -> None:
    node.pod("p", qos="burstable")
    node.share("one", "20Gi", "p")
    node.share("two", "10Gi", "p")
    assert node.limit("p") is None  # burstable: looked up under its own QoS class
    cg = node.root / "kubepods.slice" / "kubepods-burstable.slice"
    (pod_dir,) = cg.iterdir()
    region = node.region(node.nvml.backend.machine.gpus[0])
    assert dmem.limits(pod_dir, region)[:2] == (30 * GI, 30 * GI)


def test_a_restart_sets_the_limits_again_and_a_missing_cgroup_is_not_fatal(
    node: CgroupNode, caplog: pytest.LogCaptureFixture
) -> None:
    node.pod("a")
    node.pod("gone", make=False)
    a = node.share("a", "20Gi", "a")
    gone = node.share("gone", "8Gi", "gone")
    (d,) = node.record(gone).devices
    assert d.share is not None and d.share.pod_cgroups == () and d.share.applied
    assert _entry(DRIVER, d, "now")["data"]["enforcedBy"] == ["mps-namespace"]
    # A limit lost (say, a crash between setting it and saving) is set again at startup.
    (node.cgroup("a") / "dmem.max").unlink()
    node.start()
    assert node.driver.reconcile() is False
    assert node.limit("a") == 20 * GI
    (d,) = node.record(a).devices
    assert d.share is not None and d.share.pod_cgroups == (str(node.cgroup("a")),)


def test_the_kubelets_repeated_prepare_sets_the_limit_on_a_cgroup_made_anew(
    node: CgroupNode,
) -> None:
    """After a reboot or its own restart the kubelet asks again for every pod's claims
    (its "prepared" flag lives in memory), once it has made the pod's cgroup again."""
    node.pod("a")
    a = node.share("a", "20Gi", "a")
    cg = node.cgroup("a")
    for f in cg.iterdir():
        f.unlink()
    cg.rmdir()
    dmem.make_cgroup(cg)
    assert node.limit("a") is None
    assert node.driver.prepare([a])[a.uid].error == ""
    assert node.limit("a") == 20 * GI


def test_nothing_is_set_where_the_driver_cannot(tmp_path: Path) -> None:
    spec = tmp_path / "gpus.yaml"
    spec.write_text(SPEC_615.replace("615.71.09", "570.86.15"))
    root = tmp_path / "cgroup"
    dmem.make_hierarchy(root, {})
    driver, _ = fake_preparer(
        tmp_path,
        f"@{spec}",
        lambda ref: {},
        mode=MigMode.NONE,
        consumable=parse_mode("memory"),
        cgroup_root=root,
    )
    pm = driver.executor.pod_memory
    assert pm is not None and pm.unavailable is not None
    assert "Function Not Found" in pm.unavailable

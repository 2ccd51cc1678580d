"""Fixtures for end-to-end tests against the real local control plane.

The control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager built
from their Go modules) is started once per test session; DRADRIVER_TEST_KUBECONFIG
points the suite at an already running one instead.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dradriver.k8s import Kube, KubeError, path_for
from dradriver.k8s.lines import OLDEST
from dradriver_dev import cluster as devcluster

from . import helpers
from .helpers import REPO, Cluster, HollowNode, new_namespace

pytestmark = pytest.mark.e2e

# What `make test` runs on every Kubernetes line, not only on 1.34 and the newest
# (pytest -m lines): slices in every MIG mode, prepare through the real kubelet (whole
# GPUs, dynamic and static MIG, shares, sharing), health taints, claim status and
# binding conditions under the chart's own grants and a real pod-bound token, the
# webhook, the extended-resource path, the control plane's gates and the skew case.
LINES_MODULES = frozenset(
    {
        "test_cluster", "test_hollow_node", "test_slices", "test_publisher",
        "test_kubelet_plugin", "test_static_mig", "test_dynamic_mig", "test_consumable",
        "test_sharing", "test_health", "test_computedomain_binding", "test_webhook",
        "test_extended_resource", "test_skew",
    }
)  # fmt: skip
# What no line changes (the plugin's gRPC server under attack and bursts, the dashboard's
# queries over the fleet's metrics, the fleet's page in a browser): run once, in the first
# line's whole-suite pass, not again in the newest line's (a single test of a module that
# runs on every line says so with @pytest.mark.once). DRADRIVER_E2E_EVERY_LINE=1 runs them on
# whatever line $K8S names, as a change to what they check asks.
ONCE_MODULES = frozenset({"test_hostile_peers", "test_dashboard", "test_fleet_picture"})
# Of the chart's tests, those that meet each line's API server and authorization.
LINES_CHART_TESTS = ("accepted_by_the_api_server", "rbac", "may_write_only", "may_set_only")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    first = devcluster.current_line() == OLDEST or os.environ.get("DRADRIVER_E2E_EVERY_LINE") == "1"
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        chart = module == "test_chart" and any(t in item.name for t in LINES_CHART_TESTS)
        if (module in LINES_MODULES or chart) and not item.get_closest_marker("whole_suite"):
            item.add_marker(pytest.mark.lines)
        if (module in ONCE_MODULES or item.get_closest_marker("once")) and not first:
            item.add_marker(
                pytest.mark.skip(reason=f"no line changes it: runs once, in {OLDEST.name}'s pass")
            )


@pytest.fixture(scope="module", autouse=True)
def status_patches_accepted() -> Iterator[None]:
    """Fails the module when a hollow node's kubelet logged a status patch the API server
    refused while it ran (set up before, and torn down after, the module's fixtures)."""
    for path in list(helpers.KUBELET_LOGS):
        helpers.KUBELET_LOGS[path] = path.stat().st_size if path.exists() else 0
    helpers.REFUSED_PATCHES.clear()
    yield
    for path in list(helpers.KUBELET_LOGS):
        helpers.read_refused_patches(path)
    refused, helpers.REFUSED_PATCHES[:] = list(helpers.REFUSED_PATCHES), []
    if refused:
        pytest.fail("the API server refused a kubelet's pod status patches:\n" + "\n".join(refused))


def _start_cluster(alpha: bool, *, gang: bool = False) -> Iterator[Cluster]:
    external = None if alpha or gang else os.environ.get("DRADRIVER_TEST_KUBECONFIG")
    ln = devcluster.current_line()
    if external:
        yield Cluster(kubeconfig=external, bin_dir=None, alpha=alpha, state_dir=None, line=ln)
        return
    state_dir = Path(tempfile.mkdtemp(prefix="dradriver-cluster-"))
    st = devcluster.up(state_dir, alpha=alpha, k8s=ln, gang=gang)
    try:
        yield Cluster(
            kubeconfig=st.kubeconfig,
            bin_dir=Path(st.bin_dir),
            alpha=alpha,
            state_dir=state_dir,
            line=ln,
        )
    finally:
        devcluster.down(state_dir)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The control plane of the line $K8S names (1.34 when unset), with the line's default
    gates: from 1.36 every DRA feature the driver has."""
    yield from _start_cluster(alpha=False)


@pytest.fixture(scope="session")
def kube(cluster: Cluster) -> Iterator[Kube]:
    k = Kube.from_kubeconfig(cluster.kubeconfig)
    yield k
    k.close()


@pytest.fixture(scope="session")
def alpha_cluster() -> Iterator[Cluster]:
    """A second control plane with every DRA feature the driver has turned on: the alpha
    gates (DRAPartitionableDevices, ...) on 1.34 and 1.35, the line's defaults from 1.36;
    DRADRIVER_TEST_ALPHA_KUBECONFIG points at a running one instead."""
    external = os.environ.get("DRADRIVER_TEST_ALPHA_KUBECONFIG")
    if external:
        ln = devcluster.current_line()
        yield Cluster(kubeconfig=external, bin_dir=None, alpha=True, state_dir=None, line=ln)
        return
    yield from _start_cluster(alpha=True)


@pytest.fixture(scope="session")
def gang_cluster() -> Iterator[Cluster]:
    """A third control plane, from 1.37, with the scheduler's gang scheduling on
    (GenericWorkload, TopologyAwareWorkloadScheduling; PodGroups served)."""
    ln = devcluster.current_line()
    if ln.minor < devcluster.GANG_FROM:
        pytest.skip(f"the scheduler's gang scheduling is from 1.{devcluster.GANG_FROM}")
    yield from _start_cluster(alpha=False, gang=True)


@pytest.fixture(scope="session")
def alpha_kube(alpha_cluster: Cluster) -> Iterator[Kube]:
    k = Kube.from_kubeconfig(alpha_cluster.kubeconfig)
    yield k
    k.close()


@pytest.fixture
def namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, ready for pods (its default ServiceAccount exists)."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40].strip("-")
    name = new_namespace(kube, f"{base}-{secrets.token_hex(3)}")
    yield name
    kube.delete(path_for("v1", "namespaces", name=name), missing_ok=True)


@pytest.fixture
def cleanup(kube: Kube) -> Iterator[Callable[[str], None]]:
    """Registers cluster-scoped object paths (slices, classes, nodes) to delete after a test."""
    paths: list[str] = []
    yield paths.append
    for p in reversed(paths):
        with contextlib.suppress(KubeError):
            kube.delete(p, missing_ok=True)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temporary directory: Unix socket paths must stay under 108 bytes."""
    d = Path(tempfile.mkdtemp(prefix="drk-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def hollow_node(
    cluster: Cluster, kube: Kube, short_tmp: Path
) -> Iterator[Callable[..., HollowNode]]:
    """Starts hollow nodes (`dradriver dev kubelet`: the real kubelet's code) on the GA
    cluster unless another kubeconfig/kube pair is given; each is stopped and its Node
    deleted after the test."""
    kubelets: list[tuple[HollowNode, Kube]] = []

    def start(
        node: str | None = None,
        *,
        kubeconfig: str | None = None,
        api: Kube | None = None,
        extra_args: list[str] | None = None,
    ) -> HollowNode:
        node = node or f"node-{secrets.token_hex(3)}"
        kubelet = HollowNode(
            kubeconfig or cluster.kubeconfig, node, short_tmp / node, extra_args=extra_args
        )
        kubelets.append((kubelet, api or kube))
        kubelet.start()
        kubelet.wait_node_ready(api or kube)
        return kubelet

    yield start
    for kubelet, api in kubelets:
        kubelet.stop()
        # Shown by pytest only when the test failed: what the kubelet saw.
        print(f"--- kubelet of {kubelet.node}, last lines ---\n{kubelet.log()[-6000:]}")
        with contextlib.suppress(KubeError):
            api.delete(path_for("v1", "nodes", name=kubelet.node), missing_ok=True)


@pytest.fixture(scope="session")
def helm() -> Path:
    """The helm CLI built by tools/helm/build.sh (cached)."""
    proc = subprocess.run(
        ["bash", str(REPO / "tools" / "helm" / "build.sh")], stdout=subprocess.PIPE, text=True
    )
    assert proc.returncode == 0, "tools/helm/build.sh failed (its output is above)"
    return Path(proc.stdout.strip().splitlines()[-1]) / "helm"

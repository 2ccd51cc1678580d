"""ComputeDomains with device binding conditions (KEP-5007), on the control plane with
the alpha DRA gates: the channel device names IMEXDaemonReady and IMEXDaemonFailed, so
the real scheduler allocates each pod's channel, then holds its binding until the
node's plugin says the domain's IMEX daemon there is ready; the pod reaches its node
only then, and prepare adopts the daemon already running. A daemon that cannot get
ready makes the node report the failure: the scheduler places the pod again, nothing
is left on the node, and explain names the IMEX layer.
"""

from __future__ import annotations

import io
import json
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from dradriver.api import computedomain as cd
from dradriver.cli import main
from dradriver.k8s import Kube, path_for
from tests.support.local_daemons import process_alive

from .helpers import RES, Cluster, get_or_none, wait_for
from .test_computedomain import (
    CDS,
    DATA,
    DRIVER,
    Controller,
    Rack,
    domain,
    events_of,
    job_pod,
    rack_of,
    running,
    wait_reason,
)

pytestmark = pytest.mark.e2e
TRAYS = {
    "bc-a1": f"fake:@{DATA / 'gb200-clique-1.yaml'}",
    "bc-a2": f"fake:@{DATA / 'gb200-clique-1.yaml'}",
}
ADDRESS = {"bc-a1": "127.0.0.14", "bc-a2": "127.0.0.15"}


@pytest.fixture(scope="module")
def trays(alpha_cluster: Cluster, alpha_kube: Kube) -> Iterator[Rack]:
    with rack_of(alpha_cluster.kubeconfig, alpha_kube, TRAYS, ADDRESS) as out:
        # Published with the binding conditions: this API server keeps them.
        def held() -> bool:
            slices = alpha_kube.list(
                path_for(RES, "resourceslices"), fieldSelector=f"spec.driver={DRIVER}"
            )
            found = [
                d
                for s in slices.get("items", [])
                if s["spec"].get("nodeName") in TRAYS
                for d in s["spec"].get("devices") or []
                if d["name"] == cd.CHANNEL_DEVICE
            ]
            return len(found) == 2 and all(
                d.get("bindingConditions") == [cd.BINDING_CONDITION]
                and d.get("bindingFailureConditions") == [cd.BINDING_FAILURE]
                for d in found
            )

        wait_for(held, "the channel devices with their binding conditions", 30)
        yield out


@pytest.fixture
def ns(alpha_kube: Kube) -> Iterator[str]:
    name = f"bind-{secrets.token_hex(3)}"
    alpha_kube.create(path_for("v1", "namespaces"), {"metadata": {"name": name}})
    wait_for(
        lambda: get_or_none(alpha_kube, path_for("v1", "serviceaccounts", name, name="default")),
        "the namespace's default ServiceAccount",
        30,
    )
    yield name
    alpha_kube.delete(path_for("v1", "namespaces", name=name), missing_ok=True)


@pytest.fixture
def controller(alpha_cluster: Cluster, alpha_kube: Kube, ns: str) -> Iterator[Controller]:
    tmp = Path(tempfile.mkdtemp(prefix="drk-bctl-"))
    c = Controller(alpha_cluster.kubeconfig, tmp, ns, "bind")
    c.start()
    yield c
    try:
        alpha_kube.delete_collection(path_for(*CDS, ns))
        wait_for(
            lambda: not alpha_kube.list(path_for(*CDS, ns)).get("items"),
            "the test's domains deleted",
            45,
        )
    finally:
        c.stop()
        print(f"--- controller, last lines ---\n{c.log()[-4000:]}")
        shutil.rmtree(tmp, ignore_errors=True)


def channel_status(claim: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """type -> condition of the claim's channel entry in status.devices."""
    for d in (claim.get("status") or {}).get("devices") or []:
        if d["driver"] == DRIVER and d["device"] == cd.CHANNEL_DEVICE:
            return {c["type"]: c for c in d.get("conditions") or []}
    return {}


def daemon_pids(trays: Rack, node: str) -> list[int]:
    """The node's IMEX daemons that run: its runtime runs their pods as processes."""
    return trays.kubelets[node].host_processes()


def explain_verdict(kubeconfig: str, ns: str, pod: str) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        main(["explain", f"pod/{pod}", "-n", ns, "--kubeconfig", kubeconfig])
    (verdict,) = [x for x in out.getvalue().splitlines() if x.startswith("=> ")]
    return verdict


def test_pods_are_bound_once_their_nodes_daemons_are_ready(
    alpha_kube: Kube, ns: str, trays: Rack, controller: Controller
) -> None:
    """One pod of a two-node job alone waits unbound, its claim allocated and the node
    saying what it waits for; with the second pod both daemons start, both claims read
    IMEXDaemonReady, both pods are bound and run, and prepare adopts each daemon (the
    PID it started before binding is the one the claim's record holds)."""
    k = alpha_kube
    k.create(path_for(*CDS, ns), domain("pair", 2))
    wait_reason(k, ns, "pair", "WaitingForPods")
    k.create(path_for("v1", "pods", ns), job_pod("pair-0", "pair-channel"))

    def first_claim() -> dict[str, Any] | None:
        items = k.list(path_for(RES, "resourceclaims", ns)).get("items", [])
        for c in items:
            said = channel_status(c).get(cd.BINDING_CONDITION, {})
            if said.get("reason") == "WaitingForNodes":
                return dict(c)
        return None

    claim = wait_for(first_claim, "the first claim allocated, its node waiting for the other", 60)
    said = channel_status(claim)[cd.BINDING_CONDITION]
    assert (said["status"], said["reason"]) == ("False", "WaitingForNodes")
    pod = k.get(path_for("v1", "pods", ns, name="pair-0"))
    assert not pod["spec"].get("nodeName"), "bound before its IMEX daemon was ready"
    verdict = explain_verdict(trays.plugins["bc-a1"].kubeconfig, ns, "pair-0")
    assert verdict.startswith("=> IMEX: the scheduler holds the pod"), verdict
    assert "waiting for its nodes" in verdict
    k.create(path_for("v1", "pods", ns), job_pod("pair-1", "pair-channel"))
    pods = [running(k, ns, f"pair-{i}") for i in range(2)]
    assert {p["spec"]["nodeName"] for p in pods} == set(TRAYS)

    def both_prepared() -> list[dict[str, Any]] | None:
        # Prepare's Ready condition (written a second after it), beside the binder's.
        claims = k.list(path_for(RES, "resourceclaims", ns)).get("items", [])
        ok = len(claims) == 2 and all(
            channel_status(c).get("Ready", {}).get("status") == "True" for c in claims
        )
        return claims if ok else None

    for c in wait_for(both_prepared, "both claims prepared", 30):
        conds = channel_status(c)
        assert conds[cd.BINDING_CONDITION]["status"] == "True", conds
        assert conds[cd.BINDING_CONDITION]["reason"] == "IMEXDaemonReady"
        assert cd.BINDING_FAILURE not in conds
    cond = wait_reason(k, ns, "pair", "NodesReady")
    assert cond["status"] == "True"
    pids = []
    for p in pods:
        node = p["spec"]["nodeName"]
        (pid,) = daemon_pids(trays, node)  # one daemon: started before binding, adopted
        assert "IMEX daemon adopted" in trays.plugins[node].log()
        rec = trays.kubelets[node].container(p["metadata"]["uid"], "main")
        assert rec is not None and "DRADRIVER_IMEX_CHANNEL=0" in rec["env"]
        pids.append(pid)
    for i in range(2):
        k.delete(path_for("v1", "pods", ns, name=f"pair-{i}"))
    for i in range(2):
        wait_for(
            lambda i=i: get_or_none(k, path_for("v1", "pods", ns, name=f"pair-{i}")) is None,
            "pod gone",
            60,
        )
    wait_for(lambda: not any(process_alive(p) for p in pids), "the IMEX daemons stopped", 30)
    assert trays.imex_configs("bc-a1") == trays.imex_configs("bc-a2") == []


def test_a_daemon_that_never_gets_ready_keeps_its_pod_unbound_and_says_why(
    alpha_kube: Kube, ns: str, trays: Rack, controller: Controller
) -> None:
    """With the daemons of both trays never ready, the pod is never bound: each node
    reports IMEXDaemonFailed, the scheduler gives the node up (its event names the IMEX
    layer), no daemon is left behind; explain says so. Once the fault is gone, the
    scheduler's next try runs the pod."""
    k = alpha_kube
    faults = [trays.plugins[n].state_dir / "fake-imex-faults.json" for n in TRAYS]
    for f in faults:
        f.write_text(json.dumps({"neverReady": True}))
    try:
        k.create(path_for(*CDS, ns), domain("stuck", 1))
        wait_reason(k, ns, "stuck", "WaitingForPods")
        k.create(path_for("v1", "pods", ns), job_pod("stuck-0", "stuck-channel"))
        said = wait_for(
            lambda: "binding failed" in (e := events_of(k, ns, "stuck-0")) and e,
            "the scheduler's event of the failed binding",
            90,
        )
        assert "IMEXNotReady" in said and "IMEX layer" in said and "did not answer READY" in said
        pod = k.get(path_for("v1", "pods", ns, name="stuck-0"))
        assert not pod["spec"].get("nodeName")
        verdict = explain_verdict(trays.plugins["bc-a1"].kubeconfig, ns, "stuck-0")
        assert verdict.startswith("=> IMEX: "), verdict
        assert "did not answer READY" in verdict and "nvidia-imex-ctl -N" in verdict
    finally:
        for f in faults:
            f.unlink(missing_ok=True)
    pod = running(k, ns, "stuck-0", timeout=120)
    node = pod["spec"]["nodeName"]
    assert len(daemon_pids(trays, node)) == 1
    # The daemons of the failed tries are gone, on whichever node they ran.
    other = next(n for n in TRAYS if n != node)
    assert trays.imex_configs(other) == []
    k.delete(path_for("v1", "pods", ns, name="stuck-0"), grace_period=0)
    wait_for(lambda: all(trays.imex_configs(n) == [] for n in TRAYS), "no daemon left", 30)
    wait_for(lambda: all(daemon_pids(trays, n) == [] for n in TRAYS), "no daemon running", 30)

"""dradriver as a user installs it, in a real kind cluster (deploy/kind/): the image,
the chart's pods, claims prepared into real containers by real containerd, a helm
upgrade with claims in flight, and an uninstall that leaves the nodes clean.

The tests run in file order on one cluster (the session fixture builds it): each step
is the state the next one starts from, as for a user.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from typing import Any

import pytest

from dradriver.k8s.lines import NEWEST
from dradriver_dev import addons
from dradriver_dev.kind.demo import (
    GROUP_LABEL,
    HELM_NAMESPACE,
    IMAGE_REPOSITORY,
    Kind,
    apply,
    domain_example_docs,
    example_docs,
    inside,
    pods_of,
    show_refusal,
    wait_running,
)

DRIVER = "gpu.dradriver.io"
NS = "kind-e2e"
# The four-GPU NVLink claim and a dynamic MIG claim: the two the issue names.
EXAMPLES = {"four-nvlinked-gpus", "mig-1g10gb"}
# A claim shared by MPS (two pods) and a share by memory: each runs under an MPS daemon,
# a pod of its own on its node that must outlive the plugin (Q20).
DAEMON_EXAMPLES = {"mps-a", "mps-b", "share-a"}
# A two-node ComputeDomain on the GB200 trays: an IMEX daemon a node, peers of each other.
DOMAIN_PODS = {"train-0", "train-1"}
TRAYS = ("gb200",)


def sh(node: str, script: str) -> str:
    """A command on a kind node (the node's own shell, not a pod's)."""
    done = subprocess.run(
        ["docker", "exec", node, "sh", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"{node}: {script}: {done.stderr}"
    return done.stdout


def nodes_by_group(k: Kind) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for n in k.kubectl.json("get", "nodes")["items"]:
        out.setdefault(n["metadata"]["labels"][GROUP_LABEL], []).append(n["metadata"]["name"])
    return {g: sorted(ns) for g, ns in out.items()}


def all_nodes(k: Kind) -> list[str]:
    return sorted(n for ns in nodes_by_group(k).values() for n in ns)


def plugins_on(k: Kind, node: str) -> list[dict[str, Any]]:
    """The plugin pods on `node` (two while a rolling update runs them side by side)."""
    pods: list[dict[str, Any]] = k.kubectl.json(
        "-n", HELM_NAMESPACE, "get", "pods", "-l", "app.kubernetes.io/component=kubelet-plugin",
        "--field-selector", f"spec.nodeName={node}",
    )["items"]  # fmt: skip
    return pods


def plugin_pods(k: Kind, group: str) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = k.kubectl.json(
        "-n", HELM_NAMESPACE, "get", "pods", "-l", f"dradriver.io/node-group={group}"
    )["items"]
    return pods


def ready(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )


def mig_devices(k: Kind) -> list[str]:
    """The MIG devices NVML (the fake, from the plugin's state) reports on the H100 node,
    asked inside the plugin's own container as `dradriver devices` sees them."""
    (pod,) = [p for p in plugin_pods(k, "h100") if ready(p)][:1]
    out = k.kubectl.run(
        "-n",
        HELM_NAMESPACE,
        "exec",
        pod["metadata"]["name"],
        "--",
        "sh",
        "-c",
        'dradriver devices --node-name "$NODE_NAME" --mig-mode static -o json',
        timeout=60,
    ).stdout
    return [m["uuid"] for g in json.loads(out)["inventory"]["gpus"] for m in g["migDevices"]]


def cdi_specs(node: str) -> list[str]:
    return sh(node, "ls /var/run/cdi 2>/dev/null || true").split()


def slice_uuids(k: Kind) -> dict[tuple[str, str], str]:
    """(pool, device) -> the device's UUID attribute (MIG devices: their parent's)."""
    out = {}
    for s in k.kubectl.json("get", "resourceslices")["items"]:
        for d in s["spec"].get("devices") or []:
            attrs = {a: next(iter(v.values())) for a, v in d.get("attributes", {}).items()}
            out[(s["spec"]["pool"]["name"], d["name"])] = str(attrs.get("uuid", ""))
    return out


@pytest.fixture(scope="module")
def k(kind_cluster: Kind) -> Kind:
    return kind_cluster


def test_image_is_what_a_user_runs(k: Kind) -> None:
    image = f"{IMAGE_REPOSITORY}:dev"
    version = subprocess.run(
        ["docker", "run", "--rm", image, "--version"], capture_output=True, text=True, timeout=60
    )
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("dradriver "), version.stdout
    devices = subprocess.run(
        ["docker", "run", "--rm", image, "devices", "--devices", "fake:2xH100-80GB", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert devices.returncode == 0, devices.stderr
    gpus = json.loads(devices.stdout)["inventory"]["gpus"]
    assert [g["productName"] for g in gpus] == ["NVIDIA H100 80GB HBM3"] * 2
    info = json.loads(
        subprocess.run(
            ["docker", "image", "inspect", image], capture_output=True, text=True, check=True
        ).stdout
    )[0]
    # Non-root by default (the controller); the plugin's pod asks for root itself.
    assert info["Config"]["User"] == "65532:65532"
    assert info["Config"]["Entrypoint"] == ["dradriver"]
    size_mb = info["Size"] / 1e6
    print(f"image {image}: {size_mb:.0f} MB")
    assert size_mb < 400, f"the image weighs {size_mb:.0f} MB"


def test_chart_comes_up_ready_on_every_node(k: Kind) -> None:
    k.install("dev")
    groups = nodes_by_group(k)
    assert sorted(groups) == ["gb200", "h100", "mixed", "shared"]
    assert [len(groups[g]) for g in sorted(groups)] == [2, 1, 1, 1]
    for group, nodes in groups.items():
        # Ready means /readyz answered: registered with the kubelet, slices published, and
        # the API server reached with the pod's own ServiceAccount token (in-cluster).
        pods = plugin_pods(k, group)
        assert sorted(p["spec"]["nodeName"] for p in pods) == nodes
        assert all(ready(p) for p in pods), [p["status"] for p in pods]
    pools = {s["spec"]["pool"]["name"] for s in k.kubectl.json("get", "resourceslices")["items"]}
    assert pools == set(all_nodes(k))
    # kind runs the newest line, with no feature gate set: what the driver needs is on by
    # default there, and the dynamic MIG node's counter sets are published apart.
    versions = {
        n["status"]["nodeInfo"]["kubeletVersion"] for n in k.kubectl.json("get", "nodes")["items"]
    }
    assert versions == {NEWEST.release}
    h100 = k.kubectl.json(
        "get", "resourceslices", "--field-selector", f"spec.nodeName={groups['h100'][0]}"
    )
    assert any(
        s["spec"].get("sharedCounters") and not s["spec"].get("devices") for s in h100["items"]
    )
    ctrl = k.kubectl.json(
        "-n", HELM_NAMESPACE, "get", "deployment", "-l", "app.kubernetes.io/component=controller"
    )["items"]
    assert [d["status"].get("readyReplicas") for d in ctrl] == [1]
    # The registration and DRA sockets in the kubelet's directories, on the host paths
    # the chart mounts.
    for node in all_nodes(k):
        assert f"{DRIVER}-" in sh(node, "ls /var/lib/kubelet/plugins_registry")
        assert "dra-" in sh(node, f"ls /var/lib/kubelet/plugins/{DRIVER}")


def test_webhook_refuses_a_bad_config_at_apply(k: Kind, capsys: pytest.CaptureFixture[str]) -> None:
    k.kubectl.run("create", "namespace", "demo", check=False)
    show_refusal(k.kubectl)  # the demo's step: it raises unless kubectl apply was denied
    said = capsys.readouterr().out  # what kubectl said, as the demo shows it
    assert "denied the request" in said, said
    assert "opaque.parameters.sharing.strategy" in said, said
    assert f"(got '{addons.BAD_STRATEGY}')" in said, said


@pytest.fixture(scope="module")
def claims(k: Kind) -> list[dict[str, Any]]:
    docs = [
        d
        for d in example_docs(f"{IMAGE_REPOSITORY}:dev")
        if d["kind"] != "Pod" or d["metadata"]["name"] in EXAMPLES | DAEMON_EXAMPLES
    ]
    # Only the examples' own claims and templates.
    wanted = {
        rc.get("resourceClaimTemplateName") or rc.get("resourceClaimName")
        for p in pods_of(docs)
        for rc in p["spec"]["resourceClaims"]
    }
    docs = [d for d in docs if d["kind"] == "Pod" or d["metadata"]["name"] in wanted]
    apply(k.kubectl, docs, NS)
    # The domain first: its template, which the pods name, is the controller's to make.
    domain, *rest = domain_example_docs(f"{IMAGE_REPOSITORY}:dev")
    apply(k.kubectl, [domain], NS)
    k.kubectl.wait_for(
        "the domain's channel template",
        lambda: (
            k.kubectl.run(
                "-n", NS, "get", "resourceclaimtemplate", "train-channel", check=False
            ).returncode
            == 0
        ),
        timeout=60,
    )
    apply(k.kubectl, rest, NS)
    return [*docs, domain, *rest]


def test_claims_run_with_their_devices_inside_the_container(
    k: Kind, claims: list[dict[str, Any]]
) -> None:
    names = [p["metadata"]["name"] for p in pods_of(claims)]
    assert wait_running(k.kubectl, names, namespace=NS), k.kubectl.run(
        "-n", NS, "describe", "pods"
    ).stdout
    uuids = slice_uuids(k)
    for pod in k.kubectl.json("-n", NS, "get", "pods")["items"]:
        name = pod["metadata"]["name"]
        if name not in EXAMPLES:
            continue
        (status,) = pod["status"]["resourceClaimStatuses"]
        claim = k.kubectl.json("-n", NS, "get", "resourceclaim", status["resourceClaimName"])
        results = claim["status"]["allocation"]["devices"]["results"]
        seen = inside(k.kubectl, name, "main", NS)
        env = dict(e.split("=", 1) for e in seen["env"])
        visible = env["NVIDIA_VISIBLE_DEVICES"].split(",")
        if name == "four-nvlinked-gpus":
            # What containerd injected (CDI) names exactly the four allocated GPUs.
            assert len(results) == 4
            assert sorted(visible) == sorted(uuids[(r["pool"], r["device"])] for r in results)
            domains = {
                next(iter(d["attributes"]["nvlinkDomain"].values()))
                for s in k.kubectl.json("get", "resourceslices")["items"]
                for d in s["spec"].get("devices") or []
                if any(
                    d["name"] == r["device"] and s["spec"]["pool"]["name"] == r["pool"]
                    for r in results
                )
            }
            assert len(domains) == 1
        else:
            (r,) = results
            assert "-mig-1g10gb-" in r["device"]
            (mig,) = visible
            # A MIG UUID the node's NVML now reports: carved at prepare.
            assert mig.startswith("MIG-") and mig in mig_devices(k)
        node = pod["spec"]["nodeName"]
        assert any(claim["metadata"]["uid"] in f for f in cdi_specs(node)), cdi_specs(node)
        # The driver's files (driverFiles cdi): containerd, with no NVIDIA runtime, mounted
        # the node's driver (the fake's) and ran the toolkit's hooks, so the container's
        # ld cache lists its libraries and its nvidia-smi is on PATH.
        assert {"libcuda.so.1", "libnvidia-ml.so.1"} <= set(seen["driver"]), seen
        assert any(line.startswith("nvidia-smi ") for line in seen["driver"]), seen
        assert f"{DRIVER}-driver.json" in cdi_specs(node)


def daemon_pods(k: Kind) -> dict[str, dict[str, Any]]:
    """The plugin's daemon pods (MPS, IMEX), by name."""
    pods = k.kubectl.json(
        "-n", HELM_NAMESPACE, "get", "pods", "-l", "app.kubernetes.io/managed-by=kubelet-plugin"
    )["items"]
    return {p["metadata"]["name"]: p for p in pods}


def identity(pod: dict[str, Any]) -> tuple[str, str, int]:
    """What stays the same while a daemon runs on: its pod's UID, its container's ID and
    restart count (0: the one process since it started)."""
    (cs,) = pod["status"]["containerStatuses"]
    return pod["metadata"]["uid"], cs.get("containerID", ""), int(cs.get("restartCount", 0))


def heartbeat(k: Kind, pod: str) -> int:
    """The MPS daemon's heartbeat as its client container sees it, through the pipe
    directory CDI mounted into it (the stand-in daemon counts while it serves)."""
    out = k.kubectl.run(
        "-n", NS, "exec", pod, "--", "sh", "-c", 'cat "$CUDA_MPS_PIPE_DIRECTORY/heartbeat"',
        timeout=60,
    ).stdout  # fmt: skip
    return int(out.strip() or 0)


def beating(k: Kind, pods: list[str]) -> dict[str, int]:
    """Each client's heartbeat, once it has moved on from what it was."""
    before = {p: heartbeat(k, p) for p in pods}
    k.kubectl.wait_for(
        "the daemons' heartbeats going on in their clients",
        lambda: all(heartbeat(k, p) > before[p] for p in pods),
        timeout=30,
    )
    return before


def test_daemons_run_in_pods_of_their_own(k: Kind, claims: list[dict[str, Any]]) -> None:
    names = sorted(DAEMON_EXAMPLES | DOMAIN_PODS)
    assert wait_running(k.kubectl, names, namespace=NS), k.kubectl.run(
        "-n", NS, "describe", "pods"
    ).stdout
    daemons = daemon_pods(k)
    # One for the MPS claim of mps-a and mps-b, one for the shared node's device, and the
    # domain's IMEX daemon on each tray.
    roles = sorted(d["metadata"]["labels"]["app.kubernetes.io/component"] for d in daemons.values())
    assert roles == ["imex-daemon", "imex-daemon", "mps-daemon", "mps-daemon"], sorted(daemons)
    where = {p["spec"]["nodeName"] for p in daemons.values()}
    pods = {p["metadata"]["name"]: p for p in k.kubectl.json("-n", NS, "get", "pods")["items"]}
    assert where == {pods[n]["spec"]["nodeName"] for n in names}
    for d in daemons.values():
        assert d["status"]["phase"] == "Running", d["status"]
        assert d["spec"]["containers"][0]["image"] == f"{IMAGE_REPOSITORY}:dev"
        assert d["metadata"]["ownerReferences"][0]["kind"] == "Node"
    beating(k, sorted(DAEMON_EXAMPLES))
    # A client reads its daemon's log directory but cannot write there (the root daemon
    # writes its logs there: a planted link would have it write elsewhere).
    tried = k.kubectl.run(
        "-n", NS, "exec", "mps-a", "--", "sh", "-c", 'ls "$CUDA_MPS_LOG_DIRECTORY" && '
        'touch "$CUDA_MPS_LOG_DIRECTORY/planted"', check=False, timeout=60,
    )  # fmt: skip
    assert tried.returncode != 0 and "Read-only file system" in tried.stderr, tried
    # Both trays' daemons connected to each other, each connection made once.
    assert imex_links(k) == {(n, peer): 1 for n, peer in imex_links(k)}
    assert len(imex_links(k)) == 2


def imex_links(k: Kind) -> dict[tuple[str, str], int]:
    """(tray, peer address) -> how often the tray's IMEX daemon connected to that peer
    (fake nvidia-imex-ctl -N -j in the tray's plugin pod, in the host's network): 1 while
    the domain has stayed up. Only connected peers are listed."""
    uid = k.kubectl.json("-n", NS, "get", "computedomain", "train")["metadata"]["uid"]
    out = {}
    for pod in plugin_pods(k, "gb200"):
        if not ready(pod):
            continue
        said = k.kubectl.run(
            "-n", HELM_NAMESPACE, "exec", pod["metadata"]["name"], "--", "python3", "-m",
            "fakenvml.imexctl", "-c", f"/var/lib/dradriver/imex/{uid}/config.cfg", "-N", "-j",
            timeout=60,
        ).stdout  # fmt: skip
        status = json.loads(said)
        for peer in status["nodes"]:
            if peer["connected"] and peer.get("connects"):
                out[(pod["spec"]["nodeName"], peer["address"])] = int(peer["connects"])
    return out


def test_daemons_outlive_the_plugin_deleted_and_killed(
    k: Kind, claims: list[dict[str, Any]]
) -> None:
    """`kubectl delete pod` of the plugin, then SIGKILL of its process from the node (the
    container's PID 1, whose namespace the kernel then empties): the daemons' pods run on,
    the same processes, and their clients' heartbeats go on; the new instances adopt them."""
    before = {n: identity(p) for n, p in daemon_pods(k).items()}
    links = imex_links(k)
    nodes = sorted({p["spec"]["nodeName"] for p in daemon_pods(k).values()})
    for node in nodes:
        (pod,) = plugins_on(k, node)
        k.kubectl.run("-n", HELM_NAMESPACE, "delete", "pod", pod["metadata"]["name"], timeout=120)
    for node in nodes:
        k.kubectl.wait_for(
            f"the plugin on {node} back",
            lambda node=node: [p for p in plugins_on(k, node) if ready(p)] != [],
            timeout=120,
        )
    assert {n: identity(p) for n, p in daemon_pods(k).items()} == before
    beating(k, sorted(DAEMON_EXAMPLES))
    assert imex_links(k) == links
    for node in nodes:
        (pod,) = [p for p in plugins_on(k, node) if ready(p)]
        restarts = int(pod["status"]["containerStatuses"][0].get("restartCount", 0))
        # The pattern's brackets keep it from matching this shell's own command line.
        sh(node, "pkill -9 -f '[d]radriver kubelet-plugin'")
        k.kubectl.wait_for(
            f"the plugin on {node} restarted after SIGKILL",
            lambda node=node, restarts=restarts: any(
                ready(p)
                and int(p["status"]["containerStatuses"][0].get("restartCount", 0)) > restarts
                for p in plugins_on(k, node)
            ),
            timeout=120,
        )
    assert {n: identity(p) for n, p in daemon_pods(k).items()} == before
    beating(k, sorted(DAEMON_EXAMPLES))
    assert imex_links(k) == links
    for node in nodes:
        (pod,) = plugins_on(k, node)
        log = k.kubectl.run("-n", HELM_NAMESPACE, "logs", pod["metadata"]["name"]).stdout
        assert "not serving; starting it again" not in log, log[-3000:]
        assert "IMEX daemon started again" not in log, log[-3000:]


def test_helm_upgrade_rolls_the_plugin_side_by_side_without_losing_a_claim(
    k: Kind, claims: list[dict[str, Any]]
) -> None:
    k.image("dev-next", revision="next")
    daemons = {n: identity(p) for n, p in daemon_pods(k).items()}
    links = imex_links(k)
    assert len(daemons) == 4 and len(links) == 2
    seen_together: set[int] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            running = [
                p
                for p in plugin_pods(k, "h100")
                if p.get("status", {}).get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")
            ]
            seen_together.add(len(running))
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        k.install("dev-next")
    finally:
        stop.set()
        watcher.join()
    # maxSurge 1, maxUnavailable 0: the new instance ran beside the old before it went.
    assert 2 in seen_together, seen_together
    for node in all_nodes(k):
        # The rollout is done when helm returns; the old pod may still be on its way out
        # (its graceful stop), so until it is gone there are two.
        # helm's --wait counts a DaemonSet done with maxUnavailable pods not ready yet (the
        # GB200 trays' plugins, in the host's network, are replaced in place).
        k.kubectl.wait_for(
            f"the old plugin pod on {node} gone, the new one ready",
            lambda node=node: len(pods := plugins_on(k, node)) == 1 and ready(pods[0]),
            timeout=90,
        )
        (pod,) = plugins_on(k, node)
        assert pod["spec"]["containers"][0]["image"].endswith(":dev-next")
    # The daemons ran on under the upgrade: the same pods and processes, of the old image,
    # their clients still served; so through a rollback.
    assert {n: identity(p) for n, p in daemon_pods(k).items()} == daemons
    beating(k, sorted(DAEMON_EXAMPLES))
    assert imex_links(k) == links
    run_helm_rollback(k)
    for node in all_nodes(k):
        k.kubectl.wait_for(
            f"the plugin on {node} rolled back",
            lambda node=node: (
                [
                    p
                    for p in plugins_on(k, node)
                    if ready(p) and p["spec"]["containers"][0]["image"].endswith(":dev")
                ]
                != []
                and len(plugins_on(k, node)) == 1
            ),
            timeout=180,
        )
    assert {n: identity(p) for n, p in daemon_pods(k).items()} == daemons
    beating(k, sorted(DAEMON_EXAMPLES))
    assert imex_links(k) == links
    # The claims prepared by the old instance are the new one's: the pods still run, and
    # unpreparing through the new instance removes their CDI spec and the MIG device.
    assert wait_running(k.kubectl, [p["metadata"]["name"] for p in pods_of(claims)], 30, NS)
    before = mig_devices(k)
    assert len(before) == 1
    k.kubectl.run("-n", NS, "delete", "pod", "mig-1g10gb", "--wait=true", timeout=120)
    k.kubectl.wait_for("the MIG device destroyed", lambda: not mig_devices(k), timeout=90)


def run_helm_rollback(k: Kind) -> None:
    from dradriver_dev.kind.demo import HELM_RELEASE

    subprocess.run(
        [k.helm, "rollback", HELM_RELEASE, "--kubeconfig", str(k.kubectl.kubeconfig),
         "--namespace", HELM_NAMESPACE, "--wait", "--timeout", "5m"],
        check=True, capture_output=True, text=True, timeout=400,
    )  # fmt: skip


def test_deleting_the_pods_removes_cdi_specs_and_mig_devices(
    k: Kind, claims: list[dict[str, Any]]
) -> None:
    k.kubectl.run("-n", NS, "delete", "pods", "--all", "--wait=true", timeout=180)
    # Each daemon went with the last claim it served, and its directories with it.
    k.kubectl.wait_for("the daemons' pods gone", lambda: daemon_pods(k) == {}, timeout=120)
    for node in all_nodes(k):
        assert sh(node, "ls -A /var/lib/dradriver/mps 2>/dev/null || true").split() == [], node
    for node in all_nodes(k):
        k.kubectl.wait_for(
            f"{node}'s CDI specs removed",
            # Claims' specs; the node's driver spec stays while the driver is installed.
            lambda node=node: not [f for f in cdi_specs(node) if f"{DRIVER}-claim-" in f],
            timeout=90,
        )
    assert mig_devices(k) == []


def test_uninstall_leaves_nothing_behind_on_the_nodes(k: Kind) -> None:
    k.kubectl.run("delete", "namespace", "demo", "--wait=true", check=False, timeout=180)
    k.uninstall()
    k.kubectl.wait_for(
        "the plugin pods gone",
        lambda: not k.kubectl.json("-n", HELM_NAMESPACE, "get", "pods")["items"],
        timeout=120,
    )
    for node in all_nodes(k):
        assert not [f for f in cdi_specs(node) if "dradriver" in f]
        assert DRIVER not in sh(node, "ls /var/lib/kubelet/plugins_registry")
        assert not sh(node, f"ls /var/lib/kubelet/plugins/{DRIVER} 2>/dev/null || true").split()
        # No plugin, no sharing daemon: nothing runs from the image (its venv) any more.
        assert "/opt/dradriver/" not in sh(node, "ps -eo args")
        # The plugin saw its DaemonSet go and, nothing left to undo, emptied its state
        # directory (the directory itself is the pod's mount point: the kubelet made it).
        assert sh(node, "ls -A /var/lib/dradriver").split() == [], node
    k.kubectl.wait_for(
        "the driver's ResourceSlices gone",
        lambda: (
            not [
                s
                for s in k.kubectl.json("get", "resourceslices")["items"]
                if s["spec"]["driver"] == DRIVER
            ]
        ),
        timeout=120,
    )

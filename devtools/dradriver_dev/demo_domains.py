"""The demo's ComputeDomain: examples/claims/computedomain-job.yaml on the two fake GB200
trays of one fabric clique, and what each layer shows for it (the domain's placement and
readiness, each node's IMEX daemon and its peers, the channel in each container)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml

from dradriver.api import computedomain as cd
from dradriver.k8s import Kube, KubeError, path_for

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "claims" / "computedomain-job.yaml"
TRAY = REPO / "tests" / "data" / "gb200-clique-1.yaml"
# node -> its IMEX address (one machine: distinct loopback addresses, one port).
TRAYS = {"gb200-a": "127.0.0.31", "gb200-b": "127.0.0.32"}
PLURALS = {
    "ComputeDomain": "computedomains",
    "ResourceClaimTemplate": "resourceclaimtemplates",
    "Pod": "pods",
}


def plugin_args(ports: tuple[int, int]) -> list[str]:
    return ["--imex-channels", "on", "--imex-port", str(ports[0]), "--imex-cmd-port", str(ports[1])]


def kubelet_args(node: str) -> list[str]:
    return ["--label", f"{cd.IMEX_ADDRESS_LABEL}={TRAYS[node]}"]


def _ready(kube: Kube, ns: str, pods: list[str]) -> bool:
    try:
        phases = [
            kube.get(path_for("v1", "pods", ns, name=p)).get("status", {}).get("phase")
            for p in pods
        ]
        conds = (
            kube.get(path_for(cd.API_VERSION, cd.PLURAL, ns, name="train")).get("status") or {}
        ).get("conditions") or []
    except KubeError:
        return False
    return all(p == "Running" for p in phases) and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conds
    )


def show(kube: Kube, ns: str, roots: dict[str, Path], states: dict[str, Path], say: Any) -> None:
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    for doc in docs:
        kube.create(path_for(doc["apiVersion"], PLURALS[doc["kind"]], ns), doc)
    pods = [d["metadata"]["name"] for d in docs if d["kind"] == "Pod"]
    say(
        f"applied {EXAMPLE.relative_to(REPO)}: ComputeDomain train (numNodes 2) and pods "
        f"{', '.join(pods)}; waiting for them and the domain"
    )
    end = time.monotonic() + 90
    while not _ready(kube, ns, pods) and time.monotonic() < end:
        time.sleep(0.5)
    domain = kube.get(path_for(cd.API_VERSION, cd.PLURAL, ns, name="train"))
    st = domain.get("status") or {}
    (ready,) = [c for c in st.get("conditions", []) if c["type"] == "Ready"] or [{}]
    print(
        f"\nComputeDomain {ns}/train: clique {st.get('clique')}, IMEX channel {st.get('channel')}"
    )
    print(f"  Ready={ready.get('status')} ({ready.get('reason')}): {ready.get('message')}")
    for n in st.get("nodes", []):
        where = f"address {n.get('address')} ready={n.get('ready')} claim {n.get('claim')}"
        print(f"  node {n['name']} {where}")
    for p in pods:
        pod = kube.get(path_for("v1", "pods", ns, name=p))
        node = pod["spec"].get("nodeName", "-")
        line = f"  pod {p} on {node}: {pod['status'].get('phase')}"
        rec = (
            roots.get(node, Path("/nonexistent"))
            / "cri"
            / "pods"
            / pod["metadata"]["uid"]
            / "main.json"
        )
        if rec.exists():
            edits = json.loads(rec.read_text())
            env = [
                e
                for e in edits.get("env", [])
                if e.startswith(("DRADRIVER_IMEX", "DRADRIVER_COMPUTE"))
            ]
            line += "; " + "; ".join(env)
            if "nvidia-caps-imex-channels" in json.dumps(edits):
                line += f"; device /dev/nvidia-caps-imex-channels/channel{st.get('channel')}"
        print(line)
        for peers in sorted(states.get(node, Path("/nonexistent")).glob("imex/*/nodes_config.cfg")):
            print(f"    {node}'s IMEX daemon, peers: {', '.join(peers.read_text().split())}")
    print()

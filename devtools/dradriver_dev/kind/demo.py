"""`make kind-demo`: the driver as a user installs it, in a real kind cluster.

The image built, the chart installed with fake GPUs on three nodes (deploy/kind/), a
claim with a bad config refused by the webhook at `kubectl apply`, every example claim
applied, and what each container received from containerd, read from inside it with
`kubectl exec` (environment, /dev, mounts), not from the driver's bookkeeping.
`make kind-down` removes the cluster. `python -m dradriver_dev.kind.demo --help`.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any

import yaml

from dradriver_dev import addons
from dradriver_dev import demo as base_demo
from dradriver_dev.kind import cluster
from dradriver_dev.kind.cluster import Kubectl
from dradriver_dev.kind.images import (
    IMAGE_REPOSITORY,
    REPO,
    Images,
    KindSetupError,
    build_driver_image,
    choose,
    ensure_engine,
    run,
    say,
)

HELM_RELEASE = "dradriver"
HELM_NAMESPACE = "dradriver"
VALUES = REPO / "deploy" / "kind" / "values.yaml"
NAMESPACE = "demo"
GROUP_LABEL = "dradriver.io/fake-gpus"
# `make demo`'s placement, by node group: its node "mixed-node" is the group "mixed".
PLACEMENT = {pod: node.removesuffix("-node") for pod, node in base_demo.PLACEMENT.items()}
# What a container shows of its GPUs, from inside: the variables CDI set, /dev, and the
# mounts CDI added (MPS pipes, the shares' directories).
INSIDE = (
    'env | grep -E "^(NVIDIA|CUDA|DRADRIVER)_" | sort; '
    'echo "--dev"; ls /dev | grep -E "^nvidia" || true; '
    'echo "--mounts"; grep -E "dradriver|mps|nvidia" /proc/mounts | cut -d" " -f2 || true; '
    # The driver's files through CDI: what the ld cache lists, and nvidia-smi on PATH.
    'echo "--driver"; '
    'ldconfig -p 2>/dev/null | grep -oE "lib(cuda|nvidia-ml)\\.so\\.1 " | sort -u; '
    "command -v nvidia-smi >/dev/null && nvidia-smi 2>&1 | head -1 || true"
)


def helm() -> str:
    return (
        run(["bash", str(REPO / "tools" / "helm" / "build.sh")], what="helm", quiet=True)
        .stdout.strip()
        .splitlines()[-1]
        + "/helm"
    )


@dataclass
class Kind:
    """A kind cluster with dradriver's image loaded: what the demo and the tests share."""

    kind: str
    images: Images
    kubectl: Kubectl
    helm: str

    def image(self, tag: str, *, revision: str = "") -> str:
        image = build_driver_image(self.images.python, tag, revision=revision)
        cluster.load_image(self.kind, image)
        return image

    def install(self, tag: str, *extra: str, timeout: str = "5m") -> None:
        t0 = time.monotonic()
        run(
            [
                self.helm,
                "upgrade",
                "--install",
                HELM_RELEASE,
                str(REPO / "deploy" / "helm" / "dradriver"),
                "--kubeconfig",
                str(self.kubectl.kubeconfig),
                "--namespace",
                HELM_NAMESPACE,
                "--create-namespace",
                "-f",
                str(VALUES),
                "--set",
                f"image.tag={tag}",
                *extra,
                "--wait",
                "--timeout",
                timeout,
            ],
            what=f"helm upgrade --install {HELM_RELEASE} (image {IMAGE_REPOSITORY}:{tag})",
            timeout=600,
        )
        say(
            f"chart installed with {IMAGE_REPOSITORY}:{tag}; "
            f"every pod Ready in {time.monotonic() - t0:.0f}s"
        )

    def uninstall(self) -> None:
        run(
            [
                self.helm,
                "uninstall",
                HELM_RELEASE,
                "--kubeconfig",
                str(self.kubectl.kubeconfig),
                "--namespace",
                HELM_NAMESPACE,
                "--wait",
                "--timeout",
                "3m",
            ],
            what="helm uninstall",
            timeout=300,
        )


def up(tag: str = "dev", *, fresh: bool = False) -> Kind:
    """The cluster (created, or the running one reused unless `fresh`), the image built
    and loaded."""
    t0 = time.monotonic()
    ensure_engine()
    kind = cluster.kind()
    images = choose(cluster.stock_node_image())
    kubectl = Kubectl(cluster.kubectl_bin())
    k = Kind(kind, images, kubectl, helm())
    if cluster.exists(kind) and cluster.kubeconfig().exists() and not fresh:
        say(f"reusing the running kind cluster {cluster.name()} (`make kind-down` removes it)")
    else:
        if cluster.exists(kind):
            cluster.down(kind)
        cluster.create(kind, images, kubectl)
    cluster.install_fake_driver(kind, driver_versions(kubectl))
    k.image(tag)
    say(f"cluster and image ready in {time.monotonic() - t0:.0f}s")
    return k


def driver_versions(kubectl: Kubectl) -> dict[str, str]:
    """node -> the driver version its node group's fake GPUs report (deploy/kind/values.yaml:
    the GB200 trays' is newer, the first with IMEX channels for containers)."""
    from dradriver_dev.driver_files import driver_version

    groups = {
        g["name"]: driver_version(g["devices"])
        for g in yaml.safe_load(VALUES.read_text()).get("nodeGroups") or []
    }
    return {
        n["metadata"]["name"]: groups[n["metadata"]["labels"][GROUP_LABEL]]
        for n in kubectl.json("get", "nodes")["items"]
        if n["metadata"].get("labels", {}).get(GROUP_LABEL) in groups
    }


def example_docs(image: str) -> list[dict[str, Any]]:
    """Every example claim, its pods placed as `make demo` places them and their
    containers running `image` (the examples' CUDA image and its nvidia-smi need a real
    GPU; the driver's own image is on every node already) so that `kubectl exec` can
    look inside."""
    return [_placed(doc, image) for doc in base_demo.example_documents()]


def domain_example_docs(image: str) -> list[dict[str, Any]]:
    """examples/claims/computedomain-job.yaml, its pods on the GB200 trays and running
    `image`, as example_docs places the others (`make demo` shows it on its own)."""
    path = base_demo.REPO / "examples" / "claims" / "computedomain-job.yaml"
    return [_placed(doc, image, "gb200") for doc in yaml.safe_load_all(path.read_text()) if doc]


def _placed(doc: dict[str, Any], image: str, group: str | None = None) -> dict[str, Any]:
    if doc["kind"] == "Pod":
        spec = doc["spec"]
        group = group or PLACEMENT.get(doc["metadata"]["name"])
        if group:
            spec["nodeSelector"] = {GROUP_LABEL: group}
        else:  # the shared node's GPU is for the shares alone, the trays' for domains
            term = {"key": GROUP_LABEL, "operator": "NotIn", "values": ["shared", "gb200"]}
            required = {"nodeSelectorTerms": [{"matchExpressions": [term]}]}
            spec["affinity"] = {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}
            }
        for c in spec["containers"]:
            c["image"] = image
            c["command"] = ["sleep", "infinity"]
            c.pop("args", None)
        spec["terminationGracePeriodSeconds"] = 1
    return doc


def pods_of(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == "Pod"]


def apply(kubectl: Kubectl, docs: list[dict[str, Any]], namespace: str = NAMESPACE) -> None:
    kubectl.run("create", "namespace", namespace, check=False)
    kubectl.wait_for(
        f"the {namespace} namespace's ServiceAccount",
        lambda: (
            kubectl.run("-n", namespace, "get", "serviceaccount", "default", check=False).returncode
            == 0
        ),
    )
    kubectl.run("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(docs))


def wait_running(
    kubectl: Kubectl, names: list[str], timeout: float = 240, namespace: str = NAMESPACE
) -> bool:
    try:
        kubectl.wait_for(
            "the pods Running",
            lambda: all(
                p["status"].get("phase") == "Running"
                for p in kubectl.json("-n", namespace, "get", "pods")["items"]
                if p["metadata"]["name"] in names
            ),
            timeout=timeout,
        )
        return True
    except KindSetupError:
        return False


def inside(
    kubectl: Kubectl, pod: str, container: str, namespace: str = NAMESPACE
) -> dict[str, list[str]]:
    """What one container sees: {"env": [...], "dev": [...], "mounts": [...],
    "driver": [...]} (driver: the driver libraries its ld cache lists, then what its
    nvidia-smi says)."""
    done = kubectl.run(
        "-n", namespace, "exec", pod, "-c", container, "--", "sh", "-c", INSIDE, timeout=60
    )
    seen: dict[str, list[str]] = {"env": [], "dev": [], "mounts": [], "driver": []}
    part = "env"
    for line in done.stdout.splitlines():
        if line in ("--dev", "--mounts", "--driver"):
            part = line[2:]
        elif line.strip():
            seen[part].append(line.strip())
    return seen


def summary(kubectl: Kubectl, docs: list[dict[str, Any]]) -> str:
    out = []
    pods = {p["metadata"]["name"]: p for p in kubectl.json("-n", NAMESPACE, "get", "pods")["items"]}
    for doc in pods_of(docs):
        name = doc["metadata"]["name"]
        pod = pods.get(name, {})
        st = pod.get("status", {})
        node = pod.get("spec", {}).get("nodeName", "-")
        out.append(f"\npod {name}: {st.get('phase', '?')} on {node}")
        for cs in st.get("containerStatuses", []):
            w = cs.get("state", {}).get("waiting")
            if w:
                out.append(f"  {cs['name']} waiting: {w.get('reason')}: {w.get('message', '')}")
        if st.get("phase") != "Running":
            for c in st.get("conditions", []):
                if c.get("status") != "True" and c.get("message"):
                    out.append(f"  {c['type']}: {c['message']}")
            continue
        for c in doc["spec"]["containers"]:
            seen = inside(kubectl, name, c["name"])
            out.append(f"  container {c['name']} (kubectl exec {name} -c {c['name']}):")
            out.append("    env: " + ("; ".join(seen["env"]) or "no GPU variables"))
            out.append(
                "    /dev: "
                + (" ".join(seen["dev"]) or "no nvidia nodes (fake GPUs have none to inject)")
            )
            if seen["mounts"]:
                out.append("    mounts: " + " ".join(seen["mounts"]))
            out.append(
                "    driver (CDI): "
                + ("; ".join(seen["driver"]) or "none (driverFiles runtime, or no driver root)")
            )
    return "\n".join(out)


def show_refusal(kubectl: Kubectl) -> None:
    manifest = cluster.state() / "bad-config-claim.yaml"
    manifest.write_text(yaml.safe_dump(addons.bad_claim("bad-config"), sort_keys=False))
    say(
        "the admission webhook checks a claim's config at apply time; "
        f"one asking for sharing strategy {addons.BAD_STRATEGY!r}:"
    )
    print(f"  $ kubectl apply -n {NAMESPACE} -f {manifest.relative_to(REPO)}", flush=True)
    done = kubectl.run("apply", "-n", NAMESPACE, "-f", str(manifest), check=False)
    print("  " + (done.stderr or done.stdout).strip(), flush=True)
    if done.returncode == 0 or "denied the request" not in done.stderr:
        raise KindSetupError("the admission webhook did not refuse a claim with a bad config")


def demo() -> int:
    t0 = time.monotonic()
    k = up()
    k.install("dev")
    slices = k.kubectl.json("get", "resourceslices")["items"]
    say(
        f"{len(slices)} ResourceSlices published: "
        + ", ".join(sorted({s["spec"]["nodeName"] for s in slices}))
    )
    k.kubectl.run("create", "namespace", NAMESPACE, check=False)
    show_refusal(k.kubectl)
    docs = example_docs(f"{IMAGE_REPOSITORY}:dev")
    apply(k.kubectl, docs)
    names = [p["metadata"]["name"] for p in pods_of(docs)]
    say(f"applied {len(names)} example pods from examples/claims; waiting for them")
    if not wait_running(k.kubectl, names):
        say("not every pod runs; the summary says why")
    print(summary(k.kubectl, docs), flush=True)
    print()
    say(f"done in {time.monotonic() - t0:.0f}s ({k.images.path} images)")
    say(
        f"left running: export KUBECONFIG={cluster.kubeconfig().relative_to(REPO)}; "
        "kubectl get pods -A; `make kind-down` removes it all"
    )
    return 0


def down() -> int:
    ensure_engine()
    cluster.down(cluster.kind())
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dradriver_dev.kind.demo", description=__doc__)
    p.add_argument("action", choices=["demo", "down"], nargs="?", default="demo")
    args = p.parse_args(argv)
    try:
        return demo() if args.action == "demo" else down()
    except KindSetupError as exc:
        print(f"kind: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

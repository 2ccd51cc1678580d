"""Kueue on the local control plane: its manager (built from its Go module by
tools/kueue/build.sh, cached) as a process on loopback, its CRDs, and its DRA support on
(the DynamicResourceAllocation gate, alpha in Kueue 0.17), with each DeviceClass charged
as a quota resource of the same name.

Installed as Kueue's own manifests install it, with two differences the loopback control
plane forces:
- no admission webhooks: the API server here cannot reach a Service, and Kueue's own
  certificates name one (kueue-webhook-service.kueue-system.svc). Kueue manages a Job
  labelled with a queue without them; what its Job webhook does at create (suspend the
  Job until it is admitted) the Job's author does here (`spec.suspend: true`), or the
  Job's pods may start before Kueue suspends it.
- the CRDs carry the conversion-webhook stanza Kueue's kustomize overlay adds, so that its
  certificate rotator has somewhere to put its CA (it waits for that before starting);
  objects are written and read as v1beta2, the stored version, so nothing is converted.
"""

from __future__ import annotations

import base64
import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dradriver.k8s import Conflict, Kube, path_for
from dradriver_dev import addons, cluster, ports

BUILD_SCRIPT = cluster.REPO_ROOT / "tools" / "kueue" / "build.sh"
NAMESPACE = "kueue-system"
SERVICE = "kueue-webhook-service"
SECRET = "kueue-webhook-server-cert"
KUEUE_PROCESS = "kueue"
API = "kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


class KueueError(RuntimeError):
    pass


def build() -> Path:
    """The directory with the `kueue` binary and its `crds/`, built once and cached;
    progress goes to stderr."""
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise KueueError(f"building Kueue failed (exit {proc.returncode}); its output is above")
    return Path(proc.stdout.strip().splitlines()[-1])


def crds(built: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted((built / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if doc:
                if len(doc["spec"]["versions"]) > 1:
                    doc["spec"]["conversion"] = {
                        "strategy": "Webhook",
                        "webhook": {
                            "conversionReviewVersions": ["v1"],
                            "clientConfig": {
                                "service": {
                                    "name": SERVICE,
                                    "namespace": NAMESPACE,
                                    "path": "/convert",
                                }
                            },
                        },
                    }
                out.append(doc)
    return out


def install(kube: Kube, built: Path, deadline: float) -> None:
    """Kueue's namespace, the (empty) Secret its certificate rotator fills, and its CRDs,
    waited for until the API server serves them. Idempotent."""
    for path, body in (
        (path_for("v1", "namespaces"), {"metadata": {"name": NAMESPACE}}),
        (path_for("v1", "secrets", NAMESPACE), {"metadata": {"name": SECRET}, "type": "Opaque"}),
    ):
        with contextlib.suppress(Conflict):
            kube.create(path, body)
    addons.establish(kube, crds(built), deadline)


def configuration(
    mappings: Mapping[str, list[str]],
    cert_dir: Path,
    ports: Mapping[str, int],
    gates: Mapping[str, bool] | None = None,
    *,
    pods_ready: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Kueue's Configuration: batch/Jobs with a queue label, DRA quota by DeviceClass
    (resource name -> classes), everything on loopback, one replica; `gates`: more of
    Kueue's feature gates (DRAExtendedResources: pods asking `nvidia.com/gpu` charged as
    the class that serves it is mapped); `pods_ready`: its waitForPodsReady (all or
    nothing: a workload whose pods are not all ready in time is evicted and requeued)."""
    return {
        **({"waitForPodsReady": dict(pods_ready)} if pods_ready else {}),
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": SERVICE,
            "webhookSecretName": SECRET,
        },
        "webhook": {"host": "127.0.0.1", "port": ports["webhook"], "certDir": str(cert_dir)},
        "metrics": {"bindAddress": f"127.0.0.1:{ports['metrics']}"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['health']}"},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["batch/job"]},
        # The visibility API server wants a port and certificates of its own.
        "featureGates": {
            "DynamicResourceAllocation": True,
            "VisibilityOnDemand": False,
            **(gates or {}),
        },
        "resources": {
            "deviceClassMappings": [
                {"name": name, "deviceClassNames": list(classes)}
                for name, classes in sorted(mappings.items())
            ]
        },
    }


def workload(kube: Kube, namespace: str, job: str) -> dict[str, Any]:
    """The Workload Kueue made for a Job ({} while there is none)."""
    for w in kube.list(path_for(API, "workloads", namespace))["items"]:
        if any(o.get("name") == job for o in w["metadata"].get("ownerReferences") or []):
            return dict(w)
    return {}


def condition(w: Mapping[str, Any], kind: str, status: str = "True") -> dict[str, Any] | None:
    """A Workload's condition of type `kind`, where it has that status."""
    for c in (w.get("status") or {}).get("conditions") or []:
        if c["type"] == kind and c["status"] == status:
            return dict(c)
    return None


@dataclass
class Kueue:
    """A running Kueue manager; stop() ends it."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    health_port: int
    work: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start(
    kubeconfig: str,
    mappings: Mapping[str, list[str]],
    *,
    work: Path | None = None,
    gates: Mapping[str, bool] | None = None,
    pods_ready: Mapping[str, Any] | None = None,
    timeout: float = 120.0,
) -> Kueue:
    """Builds (cached), installs and starts Kueue against the cluster of `kubeconfig`, and
    returns once its manager is ready (its certificates made, its controllers started)."""
    deadline = time.monotonic() + timeout
    built = build()
    work = work or Path(tempfile.mkdtemp(prefix="dradriver-kueue-"))
    work.mkdir(parents=True, exist_ok=True)
    kube = Kube.from_kubeconfig(kubeconfig)
    try:
        install(kube, built, deadline)
    finally:
        kube.close()
    webhook, metrics, health = ports.free_ports(3)
    cfg = configuration(
        mappings,
        work / "certs",
        {"webhook": webhook, "metrics": metrics, "health": health},
        gates,
        pods_ready=pods_ready,
    )
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    log_path = work / "kueue.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [
                str(built / "kueue"),
                f"--config={work / 'config.yaml'}",
                f"--kubeconfig={kubeconfig}",
                "--zap-log-level=2",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    k = Kueue(proc, log_path, health, work)
    kube = Kube.from_kubeconfig(kubeconfig)
    try:
        return _wait_ready(k, kube, work / "certs", deadline, timeout)
    finally:
        kube.close()


def _mount_certs(kube: Kube, cert_dir: Path) -> bool:
    """What the kubelet does for Kueue's pod (a Secret volume at its certDir): the
    certificate its rotator wrote into the Secret, as files. True once they are there."""
    if (cert_dir / "tls.crt").exists():
        return True
    data = kube.get(path_for("v1", "secrets", NAMESPACE, name=SECRET)).get("data") or {}
    if not data.get("tls.crt") or not data.get("tls.key"):
        return False
    cert_dir.mkdir(parents=True, exist_ok=True)
    for name in ("tls.key", "ca.crt", "tls.crt"):  # tls.crt last: its presence means all
        if name in data:
            tmp = cert_dir / f".{name}.tmp"
            tmp.write_bytes(base64.b64decode(data[name]))
            tmp.chmod(0o600)
            tmp.replace(cert_dir / name)
    return True


def _wait_ready(k: Kueue, kube: Kube, cert_dir: Path, deadline: float, timeout: float) -> Kueue:
    import urllib.error
    import urllib.request

    health = k.health_port
    while True:
        _mount_certs(kube, cert_dir)
        if not k.alive():
            raise KueueError(f"Kueue exited (code {k.proc.returncode}):\n{k.log()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=2) as r:
                if r.status == 200 and "Starting workers" in k.log():
                    return k
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            k.stop()
            raise KueueError(f"Kueue not ready within {timeout:.0f} s:\n{k.log()[-3000:]}")
        time.sleep(0.3)


def main() -> int:
    """`python -m dradriver_dev.kueue KUBECONFIG CLASS...`: Kueue in the foreground, each
    class charged as a resource of its own name (for trying a ClusterQueue by hand)."""
    if len(sys.argv) < 3:
        print("usage: python -m dradriver_dev.kueue KUBECONFIG DEVICECLASS...", file=sys.stderr)
        return 2
    k = start(sys.argv[1], {c: [c] for c in sys.argv[2:]})
    print(f"kueue: running, log {k.log_path}; Ctrl-C stops it", file=sys.stderr)
    try:
        k.proc.wait()
    except KeyboardInterrupt:
        k.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The Node object and its heartbeat, as the kubelet keeps them."""

from __future__ import annotations

import contextlib
import datetime as dt
import threading

from dradriver.k8s import Conflict, Kube, KubeError, NotFound, path_for
from dradriver.logs import get_logger

log = get_logger("kubeletsim.node")

SIM_VERSION = "v1.34-dradriver-sim"
LEASE_SECONDS = 40
HEARTBEAT_SECONDS = 10.0


def now_rfc3339(micro: bool = False) -> str:
    t = dt.datetime.now(dt.UTC)
    if micro:
        return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


class NodeAgent:
    def __init__(
        self,
        kube: Kube,
        name: str,
        labels: dict[str, str] | None = None,
        cpu: str = "32",
        memory: str = "256Gi",
        pods: str = "110",
    ) -> None:
        self.kube = kube
        self.name = name
        self.labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **(labels or {}),
        }
        self.capacity = {"cpu": cpu, "memory": memory, "pods": pods}
        self.uid = ""

    def _status(self) -> dict[str, object]:
        now = now_rfc3339()
        return {
            "capacity": self.capacity,
            "allocatable": self.capacity,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet simulator is posting ready status",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.name},
            ],
            "nodeInfo": {
                "kubeletVersion": SIM_VERSION,
                "kubeProxyVersion": "",
                "machineID": self.name,
                "systemUUID": self.name,
                "bootID": "",
                "kernelVersion": "",
                "osImage": "",
                "containerRuntimeVersion": "cdi-simulated://1",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    def ensure(self) -> None:
        """Creates the Node (or adopts an existing one, merging our labels) and marks it Ready."""
        path = path_for("v1", "nodes", name=self.name)
        try:
            node = self.kube.get(path)
            self.kube.patch(path, {"metadata": {"labels": self.labels}})
        except NotFound:
            node = self.kube.create(
                path_for("v1", "nodes"),
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": self.name, "labels": self.labels},
                    "spec": {},
                },
            )
            log.info("node created", node=self.name)
        self.uid = node["metadata"]["uid"]
        self.kube.patch(
            path_for("v1", "nodes", name=self.name, subresource="status"),
            {"status": self._status()},
            patch_type="strategic",
        )
        self.renew_lease()

    def renew_lease(self) -> None:
        ns_path = path_for("coordination.k8s.io/v1", "leases", namespace="kube-node-lease")
        spec = {
            "holderIdentity": self.name,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": now_rfc3339(micro=True),
        }
        try:
            self.kube.patch(f"{ns_path}/{self.name}", {"spec": spec})
        except NotFound:
            with contextlib.suppress(Conflict):
                self.kube.create(
                    ns_path,
                    {
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {
                            "name": self.name,
                            "ownerReferences": [
                                {
                                    "apiVersion": "v1",
                                    "kind": "Node",
                                    "name": self.name,
                                    "uid": self.uid,
                                }
                            ],
                        },
                        "spec": spec,
                    },
                )

    def delete_slices(self, driver: str | None = None) -> int:
        """Deletes this node's ResourceSlices (of one driver, or all), as the kubelet does at
        start-up and when a driver has been unreachable too long."""
        selector = f"spec.nodeName={self.name}"
        if driver:
            selector += f",spec.driver={driver}"
        path = path_for("resource.k8s.io/v1", "resourceslices")
        slices = self.kube.list(path, fieldSelector=selector).get("items", [])
        for s in slices:
            self.kube.delete(f"{path}/{s['metadata']['name']}", missing_ok=True)
        if slices:
            log.info(
                "deleted resource slices", node=self.name, driver=driver or "*", count=len(slices)
            )
        return len(slices)

    def heartbeat_loop(self, stop: threading.Event) -> None:
        beats = 0
        while not stop.wait(HEARTBEAT_SECONDS):
            beats += 1
            try:
                self.renew_lease()
                if beats % 4 == 0:
                    self.kube.patch(
                        path_for("v1", "nodes", name=self.name, subresource="status"),
                        {"status": self._status()},
                        patch_type="strategic",
                    )
            except NotFound:
                # Someone deleted our Node: a kubelet re-registers it.
                try:
                    self.ensure()
                except KubeError as exc:
                    log.warning("re-creating node failed", node=self.name, error=exc.message)
            except KubeError as exc:
                log.warning("node heartbeat failed", node=self.name, error=exc.message)

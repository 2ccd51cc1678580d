"""Pod events as the kubelet records them, so `kubectl describe pod` tells the story."""

from __future__ import annotations

import threading
from typing import Any

from dradriver.k8s import Kube, KubeError, path_for
from dradriver.logs import get_logger

from .node import now_rfc3339

log = get_logger("kubeletsim.events")


class EventRecorder:
    def __init__(self, kube: Kube, node: str) -> None:
        self.kube = kube
        self.node = node
        # (pod uid, reason, message) -> (event name, count): repeats bump a count, as the
        # kubelet's event correlator does, instead of flooding the namespace.
        self._seen: dict[tuple[str, str, str], tuple[str, int]] = {}
        self._lock = threading.Lock()

    def pod_event(self, pod: dict[str, Any], type_: str, reason: str, message: str) -> None:
        meta = pod["metadata"]
        ns, uid = meta["namespace"], meta["uid"]
        key = (uid, reason, message)
        now = now_rfc3339()
        path = path_for("v1", "events", namespace=ns)
        try:
            with self._lock:
                seen = self._seen.get(key)
            if seen:
                name, count = seen
                self.kube.patch(f"{path}/{name}", {"count": count + 1, "lastTimestamp": now})
                with self._lock:
                    self._seen[key] = (name, count + 1)
                return
            ev = self.kube.create(
                path,
                {
                    "apiVersion": "v1",
                    "kind": "Event",
                    "metadata": {"generateName": f"{meta['name']}.", "namespace": ns},
                    "involvedObject": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": meta["name"],
                        "namespace": ns,
                        "uid": uid,
                    },
                    "reason": reason,
                    "message": message,
                    "type": type_,
                    "source": {"component": "kubelet", "host": self.node},
                    "reportingComponent": "kubelet",
                    "reportingInstance": self.node,
                    "firstTimestamp": now,
                    "lastTimestamp": now,
                    "count": 1,
                },
            )
            with self._lock:
                self._seen[key] = (ev["metadata"]["name"], 1)
        except KubeError as exc:
            log.warning(
                "recording event failed",
                pod=f"{ns}/{meta['name']}",
                reason=reason,
                error=exc.message,
            )

    def forget(self, pod_uid: str) -> None:
        with self._lock:
            for key in [k for k in self._seen if k[0] == pod_uid]:
                del self._seen[key]

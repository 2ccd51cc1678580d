"""The daemons' pods through the API: created on the plugin's node, found again by name,
waited for, and deleted by UID (so a later daemon of the same name is never the one
stopped)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from dradriver.errors import DaemonError
from dradriver.k8s import Conflict, Forbidden, Kube, KubeError, NotFound, path_for
from dradriver.kubeletplugin.daemons.spec import (
    COMPONENT,
    DaemonRef,
    DaemonSpec,
    PodSite,
    Role,
    component,
    pod_manifest,
)
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.daemons")
Obj = dict[str, Any]
POLL = 0.1
# Why a container does not run, as the kubelet says it: a daemon that will not come up
# is reported with this instead of waiting out the deadline.
STUCK = frozenset(
    {"CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "CreateContainerError",
     "CreateContainerConfigError", "InvalidImageName", "RunContainerError"}
)  # fmt: skip


class DaemonPods:
    def __init__(self, kube: Kube, site: PodSite) -> None:
        self.kube, self._site = kube, site

    def _path(self, name: str | None = None) -> str:
        return path_for("v1", "pods", self._site.namespace, name=name)

    def _pod(self, ref: DaemonRef) -> Obj | None:
        """`ref`'s pod; None if it is gone, or another pod of its name (a UID of its own,
        where `ref`'s is known) is there instead."""
        try:
            pod = self.kube.get(self._path(ref.name), timeout=10)
        except NotFound:
            return None
        except KubeError as exc:
            raise _api_error(f"reading daemon pod {self._site.namespace}/{ref.name}", exc) from exc
        return None if ref.uid and pod["metadata"].get("uid") != ref.uid else pod

    def start(self, spec: DaemonSpec) -> DaemonRef:
        """The daemon's pod, created, or the one of its name already there (a retry's, or
        an earlier plugin's: adopted, whatever image it runs)."""
        if not self._site.image:
            raise DaemonError(
                f"no --daemon-image: the {spec.role.upper()} daemon {spec.name} runs in a pod of "
                "its own, of that image (the chart sets the plugin's)",
                reason="daemon_image",
            )
        if not self._site.node_uid:  # the Node's, for the pods' ownerReference
            try:
                node = self.kube.get(path_for("v1", "nodes", name=self._site.node), timeout=10)
                uid = str((node.get("metadata") or {}).get("uid") or "")
            except KubeError:
                uid = ""  # no owner then: the pods live until the plugin deletes them
            self._site = dataclasses.replace(self._site, node_uid=uid)
        body = pod_manifest(spec, self._site)
        for _ in range(3):
            try:
                made = self.kube.create(self._path(), body)
                log.info("daemon pod created", pod=spec.name, namespace=self._site.namespace)
                return _ref(made)
            except Conflict:
                found = self._pod(DaemonRef(spec.name))
                if found is None:
                    continue  # gone in between: create again
                if (found.get("metadata") or {}).get("deletionTimestamp"):
                    self.stop(_ref(found))  # an unprepare's, still ending: then a new one
                    continue
                return _ref(found)
            except Forbidden as exc:
                raise DaemonError(
                    f"creating daemon pod {self._site.namespace}/{spec.name}: {exc.message}; "
                    "the plugin's ServiceAccount needs pods create in its namespace (the "
                    "chart grants it, and its admission policy allows only this node's "
                    "daemons)",
                    reason="daemon_forbidden",
                ) from exc
            except KubeError as exc:
                where = f"{self._site.namespace}/{spec.name}"
                raise _api_error(f"creating daemon pod {where}", exc) from exc
        raise DaemonError(
            f"daemon pod {self._site.namespace}/{spec.name} kept changing while it was made; "
            "the kubelet retries",
            reason="daemon_api",
        )

    def wait(self, ref: DaemonRef, ready: Callable[[], bool], *, timeout: float) -> None:
        """Until the pod runs and `ready()` says the daemon serves; DaemonError saying why
        not (the pod gone, its container stuck, or the deadline)."""
        deadline = time.monotonic() + timeout
        while True:
            pod = self._pod(ref)
            if pod is None:
                raise DaemonError(
                    f"daemon pod {self._site.namespace}/{ref.name} was deleted while it started",
                    reason="daemon_gone",
                )
            state, stuck = _state(pod)
            if state == "running" and ready():
                return
            if stuck or time.monotonic() > deadline:
                waited = "" if stuck else f" after {timeout:.0f} s"
                raise DaemonError(
                    f"daemon pod {self._site.namespace}/{ref.name} on node {self._site.node} "
                    f"is not serving ({state}){waited}: `kubectl -n {self._site.namespace} "
                    f"logs {ref.name}` and `describe pod {ref.name}` say why",
                    reason="daemon_not_ready",
                )
            time.sleep(POLL)

    def serving(self, ref: DaemonRef) -> bool:
        """The pod of `ref` (its UID where known) is there, not being deleted, and its
        container runs."""
        pod = self._pod(ref)
        return pod is not None and _state(pod)[0] == "running"  # not "terminating"

    def stop(self, ref: DaemonRef, *, timeout: float = 60.0) -> None:
        """Deletes the pod (only this UID, where known) and waits until it is gone:
        what it used may then be removed. Idempotent."""
        try:
            self.kube.delete(self._path(ref.name), uid=ref.uid or None)
        except (NotFound, Conflict):
            return  # gone; or another pod of that name (the UID precondition): not ours
        except KubeError as exc:
            raise _api_error(f"deleting daemon pod {self._site.namespace}/{ref.name}", exc) from exc
        deadline = time.monotonic() + timeout
        while self._pod(ref) is not None:
            if time.monotonic() > deadline:
                raise DaemonError(
                    f"daemon pod {self._site.namespace}/{ref.name} is still terminating after "
                    f"{timeout:.0f} s; the kubelet retries",
                    reason="daemon_stop",
                )
            time.sleep(POLL)
        log.info("daemon pod stopped", pod=ref.name, namespace=self._site.namespace)

    def find(self, role: Role, **serves: str) -> list[tuple[DaemonRef, dict[str, str]]]:
        """This node's daemon pods of `role` serving what `serves` names (labels), with
        their labels."""
        labels = {COMPONENT: component(role), **serves}
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        try:
            pods = self.kube.list(
                self._path(),
                labelSelector=selector,
                fieldSelector=f"spec.nodeName={self._site.node}",
            )
        except KubeError as exc:
            where = f"{self._site.namespace} on node {self._site.node}"
            raise _api_error(f"listing daemon pods in {where}", exc) from exc
        return [(_ref(p), dict(p["metadata"].get("labels") or {})) for p in pods.get("items") or []]


def _api_error(doing: str, exc: KubeError) -> DaemonError:
    return DaemonError(f"{doing}: {exc.message}; the kubelet retries", reason="daemon_api")


def _ref(pod: Obj) -> DaemonRef:
    meta = pod.get("metadata") or {}
    return DaemonRef(str(meta.get("name")), str(meta.get("uid") or ""))


def _state(pod: Obj) -> tuple[str, bool]:
    """(what the pod's container is doing, whether it is stuck there)."""
    status = pod.get("status") or {}
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "terminating", True
    for cs in status.get("containerStatuses") or []:
        st = cs.get("state") or {}
        if "running" in st:
            return "running", False
        if waiting := st.get("waiting"):
            why = str(waiting.get("reason") or "waiting")
            msg = str(waiting.get("message") or "")[:200]
            return f"{why}{': ' + msg if msg else ''}", why in STUCK
        if done := st.get("terminated"):
            return f"exited {done.get('exitCode')} ({done.get('reason') or 'no reason'})", False
    return f"pod {status.get('phase') or 'Pending'}", False

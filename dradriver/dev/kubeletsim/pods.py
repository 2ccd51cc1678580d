"""The pod lifecycle of the kubelet, reduced to what DRA touches.

Start: resolve the pod's claims, prepare those not yet prepared on this node (one
NodePrepareResources call per driver per pod), resolve the returned CDI devices for each
container the way a container runtime does, record each container's edits, mark the pod
Running. Stop: once no pod on the node uses a claim any more, unprepare it, then let the
pod object go.
"""

from __future__ import annotations

import json
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from dradriver.k8s import Kube, KubeError, NotFound, path_for
from dradriver.logs import get_logger

from .cdi import CDIError, ContainerEdits, Resolver, merge_env
from .events import EventRecorder
from .node import now_rfc3339
from .plugins import PluginError, PluginRegistry
from .state import ClaimState, PreparedClaim

log = get_logger("kubeletsim.pods")

PREPARE_TIMEOUT = 45.0  # the kubelet's deadline for one NodePrepare/UnprepareResources call
CLAIMS = "resource.k8s.io/v1"


class Retry(Exception):
    """Not an error yet: something the pod needs is not there (yet)."""


class PrepareFailed(Exception):
    pass


class ContainerFailed(Exception):
    pass


@dataclass
class PodSyncer:
    kube: Kube
    node: str
    root: Path
    plugins: PluginRegistry
    claims: ClaimState
    resolver: Resolver
    cdi_dirs: list[Path]
    events: EventRecorder

    def __post_init__(self) -> None:
        # The kubelet holds its DRA cache lock for a whole prepare; doing the same keeps a
        # claim shared by two pods from being prepared twice.
        self._dra_lock = threading.Lock()

    # -- paths -----------------------------------------------------------------------------
    def pod_dir(self, uid: str) -> Path:
        return self.root / "pods" / uid

    def started(self, uid: str) -> bool:
        return (self.pod_dir(uid) / "started").exists()

    # -- start -----------------------------------------------------------------------------
    def start(self, pod: dict[str, Any]) -> bool:
        """Returns True when the pod runs, False when it must be retried later."""
        meta = pod["metadata"]
        ref = f"{meta['namespace']}/{meta['name']}"
        if self.started(meta["uid"]):
            return True
        try:
            pod_claims = self._resolve_claims(pod)
            self._prepare(pod, pod_claims)
        except Retry as exc:
            log.info("pod waiting", pod=ref, reason=str(exc))
            return False
        except PrepareFailed as exc:
            msg = f"Failed to prepare dynamic resources: {exc}"
            log.error("prepare failed", pod=ref, error=str(exc))
            # Status first, then the event: whoever reacts to the event sees the status.
            self._set_waiting(pod, "ContainerCreating", msg)
            self.events.pod_event(pod, "Warning", "FailedPrepareDynamicResources", msg)
            return False
        try:
            records = self._container_records(pod, pod_claims)
        except ContainerFailed as exc:
            log.error("container creation failed", pod=ref, error=str(exc))
            self._set_waiting(pod, "CreateContainerError", str(exc))
            self.events.pod_event(pod, "Warning", "Failed", f"Error: {exc}")
            return False
        pdir = self.pod_dir(meta["uid"])
        (pdir / "containers").mkdir(parents=True, exist_ok=True)
        for name, rec in records.items():
            (pdir / "containers" / f"{name}.json").write_text(json.dumps(rec, indent=2))
        (pdir / "pod.json").write_text(
            json.dumps(
                {
                    "namespace": meta["namespace"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "claims": {k: v["metadata"]["uid"] for k, v in pod_claims.items()},
                },
                indent=2,
            )
        )
        self._set_running(pod)
        (pdir / "started").touch()
        for name, rec in records.items():
            self.events.pod_event(pod, "Normal", "Started", f"Started container {name}")
            log.info(
                "container started",
                pod=ref,
                container=name,
                cdi_devices=",".join(rec["cdiDevices"]) or "-",
            )
        return True

    def _resolve_claims(self, pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """pod claim name -> ResourceClaim, checked as the kubelet checks it."""
        meta, spec, status = pod["metadata"], pod["spec"], pod.get("status", {})
        ns, pod_uid = meta["namespace"], meta["uid"]
        generated = {
            s["name"]: s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []
        }
        out: dict[str, dict[str, Any]] = {}
        for pc in spec.get("resourceClaims") or []:
            name = pc.get("resourceClaimName")
            if not name and pc.get("resourceClaimTemplateName"):
                if pc["name"] not in generated:
                    raise Retry(f"waiting for the ResourceClaim of {pc['name']!r} to be created")
                name = generated[pc["name"]]
                if not name:
                    continue  # the controller decided this pod needs no claim
            if not name:
                raise PrepareFailed(
                    f"pod claim {pc['name']!r} names neither a claim nor a template"
                )
            try:
                claim = self.kube.get(path_for(CLAIMS, "resourceclaims", ns, name))
            except NotFound:
                raise PrepareFailed(f"ResourceClaim {ns}/{name} not found") from None
            except KubeError as exc:
                raise PrepareFailed(
                    f"unable to get ResourceClaim {ns}/{name}: {exc.message}"
                ) from None
            if not (claim.get("status") or {}).get("allocation"):
                raise PrepareFailed(f"ResourceClaim {ns}/{name} is not allocated")
            reserved = claim["status"].get("reservedFor") or []
            if not any(r.get("uid") == pod_uid for r in reserved):
                raise PrepareFailed(
                    f"pod {ns}/{meta['name']} ({pod_uid}) is not allowed to use ResourceClaim "
                    f"{ns}/{name}: it is not in the claim's reservedFor"
                )
            out[pc["name"]] = claim
        return out

    def _prepare(self, pod: dict[str, Any], pod_claims: dict[str, dict[str, Any]]) -> None:
        pod_uid = pod["metadata"]["uid"]
        with self._dra_lock:
            todo: dict[str, list[dict[str, Any]]] = {}
            for claim in pod_claims.values():
                uid = claim["metadata"]["uid"]
                have = self.claims.get(uid)
                drivers = sorted(
                    {
                        r["driver"]
                        for r in claim["status"]["allocation"]["devices"].get("results") or []
                    }
                )
                for d in drivers:
                    if have is None or d not in have.devices:
                        todo.setdefault(d, []).append(claim)
            errors = [e for d, cl in sorted(todo.items()) if (e := self._prepare_call(pod, d, cl))]
            if errors:
                raise PrepareFailed("; ".join(errors))
            for claim in pod_claims.values():
                uid = claim["metadata"]["uid"]
                if self.claims.get(uid) is None:  # a claim with no devices of any driver
                    self.claims.put(
                        PreparedClaim(
                            uid, claim["metadata"]["namespace"], claim["metadata"]["name"]
                        )
                    )
                self.claims.add_pod(uid, pod_uid)

    def _prepare_call(self, pod: dict[str, Any], driver: str, claims: list[dict[str, Any]]) -> str:
        """One NodePrepareResources for one driver; returns an error text or ''."""
        try:
            inst = self.plugins.client(driver)
        except PluginError as exc:
            return str(exc)
        m = inst.messages()
        req = m.NodePrepareResourcesRequest(
            claims=[
                m.Claim(
                    namespace=c["metadata"]["namespace"],
                    uid=c["metadata"]["uid"],
                    name=c["metadata"]["name"],
                )
                for c in claims
            ]
        )
        try:
            resp = inst.stub().NodePrepareResources(req, timeout=PREPARE_TIMEOUT)
        except grpc.RpcError as exc:
            return (
                f"NodePrepareResources of driver {driver} failed: "
                f"{exc.code().name}: {exc.details()}"
            )
        errors = []
        for c in claims:
            meta = c["metadata"]
            ref = f"{meta['namespace']}/{meta['name']}"
            if meta["uid"] not in resp.claims:
                errors.append(f"driver {driver} returned no result for claim {ref}")
                continue
            r = resp.claims[meta["uid"]]
            if r.error:
                errors.append(f"driver {driver} failed to prepare claim {ref}: {r.error}")
                continue
            devices = [
                {
                    "requestNames": list(d.request_names),
                    "poolName": d.pool_name,
                    "deviceName": d.device_name,
                    "cdiDeviceIDs": list(d.cdi_device_ids),
                }
                for d in r.devices
            ]
            have = self.claims.get(meta["uid"]) or PreparedClaim(
                meta["uid"], meta["namespace"], meta["name"]
            )
            have.devices[driver] = devices
            self.claims.put(have)
            log.info(
                "claim prepared",
                claim=ref,
                claim_uid=meta["uid"],
                driver=driver,
                devices=",".join(d["deviceName"] for d in devices) or "-",
                pod=f"{pod['metadata']['namespace']}/{pod['metadata']['name']}",
            )
        return "; ".join(errors)

    def _container_records(
        self, pod: dict[str, Any], pod_claims: dict[str, dict[str, Any]]
    ) -> dict[str, dict[str, Any]]:
        meta, spec = pod["metadata"], pod["spec"]
        uid_of = {name: c["metadata"]["uid"] for name, c in pod_claims.items()}
        out: dict[str, dict[str, Any]] = {}
        kinds = [("init", c) for c in spec.get("initContainers") or []]
        kinds += [("app", c) for c in spec.get("containers") or []]
        for kind, ctr in kinds:
            ids: list[str] = []
            for ref in (ctr.get("resources") or {}).get("claims") or []:
                claim_uid = uid_of.get(ref["name"])
                prepared = self.claims.get(claim_uid) if claim_uid else None
                if prepared is None:
                    continue
                ids += [i for i in prepared.cdi_ids(ref.get("request")) if i not in ids]
            try:
                edits = self.resolver.resolve(self.cdi_dirs, ids) if ids else ContainerEdits()
            except CDIError as exc:
                raise ContainerFailed(f"failed to create container {ctr['name']}: {exc}") from None
            static_env = [
                f"{e['name']}={e.get('value', '')}"
                for e in ctr.get("env") or []
                if "valueFrom" not in e
            ]
            out[ctr["name"]] = {
                "pod": meta["name"],
                "namespace": meta["namespace"],
                "podUID": meta["uid"],
                "container": ctr["name"],
                "init": kind == "init",
                "cdiDevices": ids,
                "env": merge_env(static_env, list(edits.env)),
                "deviceNodes": list(edits.device_nodes),
                "mounts": list(edits.mounts),
                "hooks": list(edits.hooks),
            }
        return out

    # -- status ----------------------------------------------------------------------------
    def _patch_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        meta = pod["metadata"]
        try:
            self.kube.patch(
                path_for("v1", "pods", meta["namespace"], meta["name"], "status"),
                {"metadata": {"uid": meta["uid"]}, "status": status},
                patch_type="strategic",
            )
        except KubeError as exc:
            log.warning(
                "pod status update failed",
                pod=f"{meta['namespace']}/{meta['name']}",
                error=exc.message,
            )

    def _set_waiting(self, pod: dict[str, Any], reason: str, message: str) -> None:
        now = now_rfc3339()
        self._patch_status(
            pod,
            {
                "phase": "Pending",
                "hostIP": "127.0.0.1",
                "conditions": [
                    {
                        "type": "PodReadyToStartContainers",
                        "status": "False",
                        "lastTransitionTime": now,
                    },
                    {
                        "type": "ContainersReady",
                        "status": "False",
                        "reason": reason,
                        "lastTransitionTime": now,
                    },
                    {
                        "type": "Ready",
                        "status": "False",
                        "reason": reason,
                        "lastTransitionTime": now,
                    },
                ],
                "containerStatuses": [
                    {
                        "name": c["name"],
                        "image": c.get("image", ""),
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "started": False,
                        "state": {"waiting": {"reason": reason, "message": message}},
                    }
                    for c in pod["spec"].get("containers") or []
                ],
            },
        )

    def _set_running(self, pod: dict[str, Any]) -> None:
        now = now_rfc3339()
        uid = pod["metadata"]["uid"]
        self._patch_status(
            pod,
            {
                "phase": "Running",
                "hostIP": "127.0.0.1",
                "hostIPs": [{"ip": "127.0.0.1"}],
                "startTime": now,
                "conditions": [
                    {"type": t, "status": "True", "lastTransitionTime": now}
                    for t in (
                        "PodReadyToStartContainers",
                        "Initialized",
                        "ContainersReady",
                        "Ready",
                    )
                ],
                "initContainerStatuses": [
                    {
                        "name": c["name"],
                        "image": c.get("image", ""),
                        "imageID": "",
                        "containerID": f"sim://{uid}/{c['name']}",
                        "ready": True,
                        "restartCount": 0,
                        "started": False,
                        "state": {
                            "terminated": {
                                "exitCode": 0,
                                "reason": "Completed",
                                "startedAt": now,
                                "finishedAt": now,
                            }
                        },
                    }
                    for c in pod["spec"].get("initContainers") or []
                ],
                "containerStatuses": [
                    {
                        "name": c["name"],
                        "image": c.get("image", ""),
                        "imageID": "",
                        "containerID": f"sim://{uid}/{c['name']}",
                        "ready": True,
                        "restartCount": 0,
                        "started": True,
                        "state": {"running": {"startedAt": now}},
                    }
                    for c in pod["spec"].get("containers") or []
                ],
            },
        )

    # -- stop ------------------------------------------------------------------------------
    def stop(self, pod_uid: str, pod: dict[str, Any] | None) -> bool:
        """Releases the pod's claims and, when `pod` still exists, deletes it.
        Returns False while an unprepare still has to be retried."""
        self.claims.release_pod(pod_uid)
        if not self.unprepare_unused():
            return False
        shutil.rmtree(self.pod_dir(pod_uid), ignore_errors=True)
        self.events.forget(pod_uid)
        if pod is not None:
            meta = pod["metadata"]
            try:
                self.kube.delete(
                    path_for("v1", "pods", meta["namespace"], meta["name"]),
                    grace_period=0,
                    uid=pod_uid,
                    missing_ok=True,
                )
            except KubeError as exc:
                if exc.status != 409:  # 409: the precondition failed, a new pod took the name
                    log.warning(
                        "deleting pod failed",
                        pod=f"{meta['namespace']}/{meta['name']}",
                        error=exc.message,
                    )
                    return False
            log.info("pod deleted", pod=f"{meta['namespace']}/{meta['name']}", pod_uid=pod_uid)
        return True

    def unprepare_unused(self) -> bool:
        """Unprepares every claim no pod on the node uses; True when none is left over."""
        ok = True
        with self._dra_lock:
            unused = [c for c in self.claims.snapshot() if not c.pods]
            for claim in unused:
                for driver in sorted(claim.devices):
                    if not self._unprepare_call(driver, claim):
                        ok = False
                        continue
                    claim.devices.pop(driver)
                    self.claims.put(claim)
                if not claim.devices:
                    self.claims.remove(claim.uid)
        return ok

    def _unprepare_call(self, driver: str, claim: PreparedClaim) -> bool:
        ref = f"{claim.namespace}/{claim.name}"
        try:
            inst = self.plugins.client(driver)
            m = inst.messages()
            resp = inst.stub().NodeUnprepareResources(
                m.NodeUnprepareResourcesRequest(
                    claims=[m.Claim(namespace=claim.namespace, uid=claim.uid, name=claim.name)]
                ),
                timeout=PREPARE_TIMEOUT,
            )
        except PluginError as exc:
            log.error(
                "unprepare failed", claim=ref, claim_uid=claim.uid, driver=driver, error=str(exc)
            )
            return False
        except grpc.RpcError as exc:
            log.error(
                "unprepare failed",
                claim=ref,
                claim_uid=claim.uid,
                driver=driver,
                error=f"{exc.code().name}: {exc.details()}",
            )
            return False
        r = resp.claims.get(claim.uid)
        if r is None or r.error:
            log.error(
                "unprepare failed",
                claim=ref,
                claim_uid=claim.uid,
                driver=driver,
                error=r.error if r else "no result for the claim",
            )
            return False
        log.info("claim unprepared", claim=ref, claim_uid=claim.uid, driver=driver)
        return True

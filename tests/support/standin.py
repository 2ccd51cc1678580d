"""A minimal in-test DRA plugin: the stand-in for the real kubelet plugin in the hollow
node's own tests. It speaks the real protocol over real Unix sockets, records
every call exactly as received, and writes one CDI spec per prepared claim."""

from __future__ import annotations

import json
import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from dradriver.api import kubelet as kapi
from dradriver.k8s import Kube, path_for

CDI_KIND = "test.dradriver.io/standin"


def _env_name(device: str) -> str:
    return device.upper().replace("-", "_")


@dataclass
class Call:
    method: str
    version: str
    claims: list[tuple[str, str, str]]  # (namespace, uid, name) exactly as sent


@dataclass
class StandinPlugin:
    kube: Kube | None
    driver: str
    registry_dir: Path
    plugins_dir: Path
    cdi_dir: Path
    plugin_type: str = kapi.DRA_PLUGIN_TYPE
    versions: tuple[str, ...] = (kapi.DRA_V1, kapi.DRA_V1BETA1)
    endpoint_override: str | None = None
    # Return this CDI ID instead of the one we write a spec for (to test bad IDs).
    bogus_cdi_id: str | None = None
    # claim name -> per-claim error to answer instead of preparing it
    fail_claims: dict[str, str] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    registrations: list[tuple[bool, str]] = field(default_factory=list)
    registered: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.reg_socket = self.registry_dir / f"{self.driver}-reg.sock"
        self.dra_socket = self.plugins_dir / self.driver / "dra.sock"
        self._servers: list[grpc.Server] = []
        self._lock = threading.Lock()

    # -- registration ----------------------------------------------------------------------
    def GetInfo(self, request: Any, context: Any) -> Any:
        return kapi.registration.PluginInfo(
            type=self.plugin_type,
            name=self.driver,
            endpoint=self.endpoint_override or str(self.dra_socket),
            supported_versions=list(self.versions),
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        with self._lock:
            self.registrations.append((request.plugin_registered, request.error))
        if request.plugin_registered:
            self.registered.set()
        return kapi.registration.RegistrationStatusResponse()

    # -- DRA -------------------------------------------------------------------------------
    def _prepare(self, version: str, msgs: Any, request: Any) -> Any:
        claims = [(c.namespace, c.uid, c.name) for c in request.claims]
        with self._lock:
            self.calls.append(Call("NodePrepareResources", version, claims))
        resp = msgs.NodePrepareResourcesResponse()
        for ns, uid, name in claims:
            if name in self.fail_claims:
                resp.claims[uid].error = self.fail_claims[name]
                continue
            assert self.kube is not None, "a stand-in that prepares needs the API"
            claim = self.kube.get(path_for("resource.k8s.io/v1", "resourceclaims", ns, name=name))
            results = [
                r
                for r in claim["status"]["allocation"]["devices"]["results"]
                if r["driver"] == self.driver
            ]
            devices = []
            spec_devices = []
            for r in results:
                cdi_name = f"{uid}-{r['device']}"
                spec_devices.append(
                    {
                        "name": cdi_name,
                        "containerEdits": {
                            "env": [
                                f"STANDIN_DEVICE_{_env_name(r['device'])}={r['device']}",
                                f"STANDIN_CLAIM={ns}/{name}",
                            ]
                        },
                    }
                )
                devices.append(
                    msgs.Device(
                        request_names=[r["request"].split("/")[0]],
                        pool_name=r["pool"],
                        device_name=r["device"],
                        cdi_device_ids=[self.bogus_cdi_id or f"{CDI_KIND}={cdi_name}"],
                    )
                )
            self.cdi_dir.mkdir(parents=True, exist_ok=True)
            (self.cdi_dir / f"standin-{uid}.json").write_text(
                json.dumps({"cdiVersion": "0.5.0", "kind": CDI_KIND, "devices": spec_devices})
            )
            resp.claims[uid].devices.extend(devices)
        return resp

    def _unprepare(self, version: str, msgs: Any, request: Any) -> Any:
        claims = [(c.namespace, c.uid, c.name) for c in request.claims]
        with self._lock:
            self.calls.append(Call("NodeUnprepareResources", version, claims))
        resp = msgs.NodeUnprepareResourcesResponse()
        for _, uid, _ in claims:
            (self.cdi_dir / f"standin-{uid}.json").unlink(missing_ok=True)
            resp.claims[uid].error = ""
        return resp

    def calls_of(self, method: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.method == method]

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        outer = self

        class Reg(kapi.registration_grpc.RegistrationServicer):  # type: ignore[misc]
            GetInfo = outer.GetInfo
            NotifyRegistrationStatus = outer.NotifyRegistrationStatus

        class V1(kapi.dra_v1_grpc.DRAPluginServicer):  # type: ignore[misc]
            def NodePrepareResources(self, req: Any, ctx: Any) -> Any:
                return outer._prepare("v1", kapi.dra_v1, req)

            def NodeUnprepareResources(self, req: Any, ctx: Any) -> Any:
                return outer._unprepare("v1", kapi.dra_v1, req)

        class V1beta1(kapi.dra_v1beta1_grpc.DRAPluginServicer):  # type: ignore[misc]
            def NodePrepareResources(self, req: Any, ctx: Any) -> Any:
                return outer._prepare("v1beta1", kapi.dra_v1beta1, req)

            def NodeUnprepareResources(self, req: Any, ctx: Any) -> Any:
                return outer._unprepare("v1beta1", kapi.dra_v1beta1, req)

        self.dra_socket.parent.mkdir(parents=True, exist_ok=True)
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        dra = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        kapi.dra_v1_grpc.add_DRAPluginServicer_to_server(V1(), dra)
        kapi.dra_v1beta1_grpc.add_DRAPluginServicer_to_server(V1beta1(), dra)
        dra.add_insecure_port(f"unix://{self.dra_socket}")
        dra.start()
        # The registration socket last: once it exists the kubelet may call at once.
        reg = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        kapi.registration_grpc.add_RegistrationServicer_to_server(Reg(), reg)
        reg.add_insecure_port(f"unix://{self.reg_socket}")
        reg.start()
        self._servers = [reg, dra]

    def stop(self) -> None:
        for s in self._servers:
            s.stop(grace=None)
        self._servers = []
        self.reg_socket.unlink(missing_ok=True)
        self.dra_socket.unlink(missing_ok=True)

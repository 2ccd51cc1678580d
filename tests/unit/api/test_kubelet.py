"""Tests for the kubelet gRPC protocol: generated code, wire names, live calls."""

from __future__ import annotations

import pickle
import subprocess
import sys
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor, FileDescriptor

from dradriver.api import kubelet
from dradriver.api.kubelet import (
    dra_v1,
    dra_v1_grpc,
    dra_v1beta1,
    dra_v1beta1_grpc,
    health_v1,
    health_v1alpha1,
    registration,
)

ROOT = Path(__file__).resolve().parents[3]
GEN_DIR = ROOT / "dradriver" / "api" / "gen"
GENPROTO = ROOT / "tools" / "genproto.py"


def _tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
        and "__pycache__" not in p.relative_to(root).parts
        and p.suffix not in {".pyc", ".pyo"}
    }


# --- drift -----------------------------------------------------------------


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    out = tmp_path / "gen"
    proc = subprocess.run(
        [sys.executable, str(GENPROTO), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"tools/genproto.py failed:\n{proc.stdout}\n{proc.stderr}"

    fresh = _tree(out)
    committed = _tree(GEN_DIR)
    hint = "generated code in dradriver/api/gen is stale; run `make proto` and commit the result"
    assert fresh, "tools/genproto.py produced no files"
    problems = {
        "missing": sorted(fresh.keys() - committed.keys()),
        "no longer generated": sorted(committed.keys() - fresh.keys()),
        "differ": sorted(n for n in fresh.keys() & committed.keys() if fresh[n] != committed[n]),
    }
    problems = {k: v for k, v in problems.items() if v}
    assert not problems, f"{hint}: {problems}"


def test_generation_is_deterministic(tmp_path: Path) -> None:
    trees = []
    for name in ("a", "b"):
        out = tmp_path / name
        subprocess.run([sys.executable, str(GENPROTO), "--out", str(out)], check=True)
        trees.append(_tree(out))
    assert trees[0] == trees[1]


def test_generated_grpc_modules_use_relative_imports() -> None:
    for path in GEN_DIR.rglob("*_pb2_grpc.py*"):
        text = path.read_text(encoding="utf-8")
        assert "from kubelet." not in text, path
        assert "import kubelet." not in text, path
        assert "from . import api_pb2 as " in text, path


def test_message_classes_report_their_real_module() -> None:
    # genproto replaces the api/-rooted module name protoc bakes in, so that
    # messages pickle (e.g. across multiprocessing) and repr correctly.
    for module in (dra_v1, dra_v1beta1, registration, health_v1, health_v1alpha1):
        assert module.DESCRIPTOR.message_types_by_name, module
        for name in module.DESCRIPTOR.message_types_by_name:
            assert getattr(module, name).__module__ == module.__name__
    claim = dra_v1.Claim(namespace="ns", uid="u", name="n")
    assert pickle.loads(pickle.dumps(claim)) == claim


# --- wire names --------------------------------------------------------------


def _method_paths(fd: FileDescriptor, service: str) -> set[str]:
    svc = fd.services_by_name[service]
    return {f"/{svc.full_name}/{m.name}" for m in svc.methods}


def test_registration_method_paths() -> None:
    assert registration.DESCRIPTOR.package == "pluginregistration"
    assert _method_paths(registration.DESCRIPTOR, "Registration") == {
        "/pluginregistration.Registration/GetInfo",
        "/pluginregistration.Registration/NotifyRegistrationStatus",
    }


@pytest.mark.parametrize(
    ("module", "version"),
    [(dra_v1, "v1"), (dra_v1beta1, "v1beta1")],
)
def test_dra_method_paths(module: object, version: str) -> None:
    fd: FileDescriptor = module.DESCRIPTOR  # type: ignore[attr-defined]
    assert fd.package == f"k8s.io.kubelet.pkg.apis.dra.{version}"
    assert _method_paths(fd, "DRAPlugin") == {
        f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodePrepareResources",
        f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodeUnprepareResources",
    }
    methods = fd.services_by_name["DRAPlugin"].methods_by_name
    prep = methods["NodePrepareResources"]
    assert prep.input_type.name == "NodePrepareResourcesRequest"
    assert prep.output_type.name == "NodePrepareResourcesResponse"
    assert not prep.client_streaming and not prep.server_streaming


@pytest.mark.parametrize(
    ("module", "version"),
    [(health_v1, "v1"), (health_v1alpha1, "v1alpha1")],
)
def test_health_method_path_is_server_streaming(module: object, version: str) -> None:
    fd: FileDescriptor = module.DESCRIPTOR  # type: ignore[attr-defined]
    assert fd.package == version
    assert _method_paths(fd, "DRAResourceHealth") == {
        f"/{version}.DRAResourceHealth/NodeWatchResources",
    }
    m = fd.services_by_name["DRAResourceHealth"].methods_by_name["NodeWatchResources"]
    assert m.server_streaming
    assert not m.client_streaming


def test_supported_version_constants_match_services() -> None:
    # The short names announced in PluginInfo.supported_versions must end
    # in the real service full names.
    assert kubelet.DRA_PLUGIN_TYPE == "DRAPlugin"
    full_v1 = dra_v1.DESCRIPTOR.services_by_name["DRAPlugin"].full_name
    full_v1beta1 = dra_v1beta1.DESCRIPTOR.services_by_name["DRAPlugin"].full_name
    full_health = health_v1alpha1.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name
    full_health_v1 = health_v1.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name
    assert full_v1.endswith("." + kubelet.DRA_V1)
    assert full_v1beta1.endswith("." + kubelet.DRA_V1BETA1)
    # The kubelet compares the health names whole (drahealthv1.DRAResourceHealthService).
    assert full_health == kubelet.DRA_HEALTH_V1ALPHA1 == "v1alpha1.DRAResourceHealth"
    assert full_health_v1 == kubelet.DRA_HEALTH_V1 == "v1.DRAResourceHealth"


def _field(module: object, message: str, field: str) -> FieldDescriptor:
    fd: FileDescriptor = module.DESCRIPTOR  # type: ignore[attr-defined]
    return fd.message_types_by_name[message].fields_by_name[field]


def _is_repeated(f: FieldDescriptor) -> bool:
    return bool(f.is_repeated)


def _is_map(f: FieldDescriptor) -> bool:
    mt = f.message_type
    return (
        _is_repeated(f)
        and mt is not None
        and mt.GetOptions().map_entry
        and [x.name for x in mt.fields] == ["key", "value"]
    )


def test_registration_field_numbers() -> None:
    expected = {
        ("PluginInfo", "type"): (1, FieldDescriptor.TYPE_STRING, False),
        ("PluginInfo", "name"): (2, FieldDescriptor.TYPE_STRING, False),
        ("PluginInfo", "endpoint"): (3, FieldDescriptor.TYPE_STRING, False),
        ("PluginInfo", "supported_versions"): (4, FieldDescriptor.TYPE_STRING, True),
        ("RegistrationStatus", "plugin_registered"): (1, FieldDescriptor.TYPE_BOOL, False),
        ("RegistrationStatus", "error"): (2, FieldDescriptor.TYPE_STRING, False),
    }
    for (msg, name), (number, typ, repeated) in expected.items():
        f = _field(registration, msg, name)
        assert (f.number, f.type, _is_repeated(f)) == (number, typ, repeated), (msg, name)
    assert not registration.InfoRequest.DESCRIPTOR.fields
    assert not registration.RegistrationStatusResponse.DESCRIPTOR.fields


@pytest.mark.parametrize("module", [dra_v1, dra_v1beta1], ids=["v1", "v1beta1"])
def test_dra_field_numbers(module: object) -> None:
    s, m = FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE
    expected = {
        ("Claim", "namespace"): (1, s, False),
        ("Claim", "uid"): (2, s, False),
        ("Claim", "name"): (3, s, False),
        ("NodePrepareResourcesRequest", "claims"): (1, m, True),
        ("NodePrepareResourceResponse", "devices"): (1, m, True),
        ("NodePrepareResourceResponse", "error"): (2, s, False),
        ("Device", "request_names"): (1, s, True),
        ("Device", "pool_name"): (2, s, False),
        ("Device", "device_name"): (3, s, False),
        ("Device", "cdi_device_ids"): (4, s, True),
        ("NodeUnprepareResourcesRequest", "claims"): (1, m, True),
        ("NodeUnprepareResourceResponse", "error"): (1, s, False),
    }
    for (msg, name), (number, typ, repeated) in expected.items():
        f = _field(module, msg, name)
        assert (f.number, f.type, _is_repeated(f)) == (number, typ, repeated), (msg, name)

    for msg, value_type in [
        ("NodePrepareResourcesResponse", "NodePrepareResourceResponse"),
        ("NodeUnprepareResourcesResponse", "NodeUnprepareResourceResponse"),
    ]:
        claims = _field(module, msg, "claims")
        assert claims.number == 1
        assert _is_map(claims), f"{msg}.claims must be a map"
        assert claims.message_type is not None
        key, value = claims.message_type.fields
        assert key.type == FieldDescriptor.TYPE_STRING
        assert value.message_type is not None
        assert value.message_type.name == value_type

    # The request's claims are a list, not a map.
    assert not _is_map(_field(module, "NodePrepareResourcesRequest", "claims"))


def test_share_id_is_v1s_optional_field_5() -> None:
    f = _field(dra_v1, "Device", "share_id")
    assert (f.number, f.type, _is_repeated(f)) == (5, FieldDescriptor.TYPE_STRING, False)
    # proto3 `optional`: unset and "" differ, as the kubelet's *string does.
    assert f.has_presence
    assert not dra_v1.Device().HasField("share_id")
    assert "share_id" not in dra_v1beta1.Device.DESCRIPTOR.fields_by_name


def test_dra_wire_format_is_stable() -> None:
    # Encoding pins the field numbers independently of the descriptors:
    # Claim{namespace=1:"ns", uid=2:"u", name=3:"n"}.
    claim = dra_v1.Claim(namespace="ns", uid="u", name="n")
    assert claim.SerializeToString() == b"\x0a\x02ns\x12\x01u\x1a\x01n"
    # Device.cdi_device_ids is field 4, length-delimited: tag 0x22.
    dev = dra_v1.Device(cdi_device_ids=["x"])
    assert dev.SerializeToString() == b"\x22\x01x"
    # Device.share_id is field 5, length-delimited: tag 0x2a; unset, it is not sent.
    assert dra_v1.Device(share_id="s").SerializeToString() == b"\x2a\x01s"
    # v1 and v1beta1 share the wire format.
    assert dra_v1beta1.Claim.FromString(claim.SerializeToString()) == dra_v1beta1.Claim(
        namespace="ns", uid="u", name="n"
    )


@pytest.mark.parametrize("module", [health_v1, health_v1alpha1], ids=["v1", "v1alpha1"])
def test_health_field_numbers_and_enum(module: object) -> None:
    expected = {
        ("NodeWatchResourcesResponse", "devices"): (1, FieldDescriptor.TYPE_MESSAGE, True),
        ("DeviceIdentifier", "pool_name"): (1, FieldDescriptor.TYPE_STRING, False),
        ("DeviceIdentifier", "device_name"): (2, FieldDescriptor.TYPE_STRING, False),
        ("DeviceHealth", "device"): (1, FieldDescriptor.TYPE_MESSAGE, False),
        ("DeviceHealth", "health"): (2, FieldDescriptor.TYPE_ENUM, False),
        ("DeviceHealth", "last_updated_time"): (3, FieldDescriptor.TYPE_INT64, False),
        ("DeviceHealth", "health_check_timeout_seconds"): (4, FieldDescriptor.TYPE_INT64, False),
        ("DeviceHealth", "message"): (5, FieldDescriptor.TYPE_STRING, False),
    }
    for (msg, name), (number, typ, repeated) in expected.items():
        f = _field(module, msg, name)
        assert (f.number, f.type, _is_repeated(f)) == (number, typ, repeated), (msg, name)
    fd: FileDescriptor = module.DESCRIPTOR  # type: ignore[attr-defined]
    enum = fd.enum_types_by_name["HealthStatus"]
    assert {v.name: v.number for v in enum.values} == {
        "UNKNOWN": 0,
        "HEALTHY": 1,
        "UNHEALTHY": 2,
    }
    assert module.HEALTHY == 1  # type: ignore[attr-defined]
    assert module.UNHEALTHY == 2  # type: ignore[attr-defined]


def test_health_v1_and_v1alpha1_share_the_wire_format() -> None:
    def report(m: Any) -> bytes:
        resp = m.NodeWatchResourcesResponse()
        resp.devices.add(
            device=m.DeviceIdentifier(pool_name="node-a", device_name="gpu-0"),
            health=m.UNHEALTHY,
            last_updated_time=1_700_000_000,
            health_check_timeout_seconds=30,
            message="xid-79",
        )
        return bytes(resp.SerializeToString())

    assert report(health_v1) == report(health_v1alpha1)
    # DeviceHealth.health_check_timeout_seconds is field 4 (varint, tag 0x20) and
    # message field 5 (length-delimited, tag 0x2a).
    dev = health_v1.DeviceHealth(health_check_timeout_seconds=30, message="m")
    assert dev.SerializeToString() == b"\x20\x1e\x2a\x01m"


# --- live round trip ---------------------------------------------------------


class _V1Servicer(dra_v1_grpc.DRAPluginServicer):
    def NodePrepareResources(
        self,
        request: dra_v1.NodePrepareResourcesRequest,
        context: grpc.ServicerContext,
    ) -> dra_v1.NodePrepareResourcesResponse:
        resp = dra_v1.NodePrepareResourcesResponse()
        for claim in request.claims:
            resp.claims[claim.uid].devices.add(
                request_names=["gpu"],
                pool_name="node-a",
                device_name=f"gpu-{claim.name}",
                cdi_device_ids=[f"k8s.gpu.example.com/gpu=v1-{claim.uid}"],
            )
        return resp

    def NodeUnprepareResources(
        self,
        request: dra_v1.NodeUnprepareResourcesRequest,
        context: grpc.ServicerContext,
    ) -> dra_v1.NodeUnprepareResourcesResponse:
        resp = dra_v1.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            resp.claims[claim.uid].error = f"v1 cannot unprepare {claim.name}"
        return resp


class _V1beta1Servicer(dra_v1beta1_grpc.DRAPluginServicer):
    def NodePrepareResources(
        self,
        request: dra_v1beta1.NodePrepareResourcesRequest,
        context: grpc.ServicerContext,
    ) -> dra_v1beta1.NodePrepareResourcesResponse:
        resp = dra_v1beta1.NodePrepareResourcesResponse()
        for claim in request.claims:
            resp.claims[claim.uid].devices.add(
                pool_name="node-a",
                device_name=f"gpu-{claim.name}",
                cdi_device_ids=[f"k8s.gpu.example.com/gpu=v1beta1-{claim.uid}"],
            )
        return resp

    def NodeUnprepareResources(
        self,
        request: dra_v1beta1.NodeUnprepareResourcesRequest,
        context: grpc.ServicerContext,
    ) -> dra_v1beta1.NodeUnprepareResourcesResponse:
        resp = dra_v1beta1.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            resp.claims[claim.uid].SetInParent()
        return resp


def test_round_trip_v1_and_v1beta1_on_one_unix_socket(tmp_path: Path) -> None:
    # Short relative name: Unix socket paths are limited to ~107 bytes and
    # pytest's tmp_path can be long.
    sock = tmp_path / "dra.sock"
    address = f"unix://{sock}"
    if len(str(sock)) > 100:
        pytest.skip(f"tmp_path too long for a Unix socket: {sock}")

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    dra_v1_grpc.add_DRAPluginServicer_to_server(_V1Servicer(), server)
    dra_v1beta1_grpc.add_DRAPluginServicer_to_server(_V1beta1Servicer(), server)
    assert server.add_insecure_port(address) != 0
    server.start()
    try:
        assert sock.exists()
        with grpc.insecure_channel(address) as channel:
            grpc.channel_ready_future(channel).result(timeout=10)

            v1 = dra_v1_grpc.DRAPluginStub(channel)
            resp = v1.NodePrepareResources(
                dra_v1.NodePrepareResourcesRequest(
                    claims=[dra_v1.Claim(namespace="default", uid="uid-1", name="c1")]
                ),
                timeout=10,
            )
            assert set(resp.claims) == {"uid-1"}
            result = resp.claims["uid-1"]
            assert result.error == ""
            assert len(result.devices) == 1
            dev = result.devices[0]
            assert list(dev.request_names) == ["gpu"]
            assert (dev.pool_name, dev.device_name) == ("node-a", "gpu-c1")
            assert list(dev.cdi_device_ids) == ["k8s.gpu.example.com/gpu=v1-uid-1"]

            unprep = v1.NodeUnprepareResources(
                dra_v1.NodeUnprepareResourcesRequest(
                    claims=[dra_v1.Claim(namespace="default", uid="uid-1", name="c1")]
                ),
                timeout=10,
            )
            assert unprep.claims["uid-1"].error == "v1 cannot unprepare c1"

            beta = dra_v1beta1_grpc.DRAPluginStub(channel)
            bresp = beta.NodePrepareResources(
                dra_v1beta1.NodePrepareResourcesRequest(
                    claims=[
                        dra_v1beta1.Claim(namespace="ns", uid="uid-2", name="c2"),
                        dra_v1beta1.Claim(namespace="ns", uid="uid-3", name="c3"),
                    ]
                ),
                timeout=10,
            )
            assert sorted(bresp.claims) == ["uid-2", "uid-3"]
            assert list(bresp.claims["uid-3"].devices[0].cdi_device_ids) == [
                "k8s.gpu.example.com/gpu=v1beta1-uid-3"
            ]
            bunprep = beta.NodeUnprepareResources(
                dra_v1beta1.NodeUnprepareResourcesRequest(
                    claims=[dra_v1beta1.Claim(namespace="ns", uid="uid-2", name="c2")]
                ),
                timeout=10,
            )
            assert set(bunprep.claims) == {"uid-2"}
            assert bunprep.claims["uid-2"].error == ""

            # The raw method path reaches the v1beta1 servicer, proving that
            # both services are registered under their distinct full names.
            raw = channel.unary_unary(
                "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
                request_serializer=dra_v1beta1.NodePrepareResourcesRequest.SerializeToString,
                response_deserializer=dra_v1beta1.NodePrepareResourcesResponse.FromString,
            )
            rresp = raw(
                dra_v1beta1.NodePrepareResourcesRequest(claims=[dra_v1beta1.Claim(uid="u4")]),
                timeout=10,
            )
            assert list(rresp.claims["u4"].devices[0].cdi_device_ids) == [
                "k8s.gpu.example.com/gpu=v1beta1-u4"
            ]

            # A service that is not registered answers UNIMPLEMENTED.
            missing = channel.unary_unary(
                "/k8s.io.kubelet.pkg.apis.dra.v1alpha4.DRAPlugin/NodePrepareResources",
                request_serializer=dra_v1.NodePrepareResourcesRequest.SerializeToString,
                response_deserializer=dra_v1.NodePrepareResourcesResponse.FromString,
            )
            with pytest.raises(grpc.RpcError) as exc:
                missing(dra_v1.NodePrepareResourcesRequest(), timeout=10)
            assert exc.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        server.stop(grace=None).wait(timeout=10)

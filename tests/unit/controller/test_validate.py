"""Pure checks of claims and templates: our configs decode and name requests that exist."""

from __future__ import annotations

from typing import Any

import pytest

from dradriver.controller.validate import (
    devices_problems,
    object_problems,
    reference_problems,
    request_names,
)

DRIVER = "gpu.dradriver.io"
V = "gpu.dradriver.io/v1alpha1"
GOOD = {"apiVersion": V, "kind": "GpuConfig"}
SHARED = {
    "apiVersion": V,
    "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
}
PRIORITIZED = {
    "name": "gpu",
    "firstAvailable": [
        {"name": "h100", "deviceClassName": "gpu.dradriver.io"},
        {"name": "a100", "deviceClassName": "gpu.dradriver.io"},
    ],
}


def config(params: Any, requests: list[str] | None = None, driver: str = DRIVER) -> dict[str, Any]:
    c: dict[str, Any] = {"opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        c["requests"] = requests
    return c


def devices(*configs: dict[str, Any], requests: list[dict[str, Any]] | None = None) -> Any:
    reqs = (
        requests
        if requests is not None
        else [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dradriver.io"}}]
    )
    return {"requests": reqs, "config": list(configs)}


def claim(*configs: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"metadata": {"name": "c"}, "spec": {"devices": devices(*configs, **kw)}}


def template(*configs: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"metadata": {"name": "t"}, "spec": {"spec": {"devices": devices(*configs, **kw)}}}


def messages(kind: str, obj: dict[str, Any]) -> list[str]:
    return [p.message for p in object_problems(kind, obj, DRIVER)]


def test_good_configs_are_admitted() -> None:
    assert messages("ResourceClaim", claim(config(GOOD), config(SHARED, ["gpu"]))) == []
    assert messages("ResourceClaimTemplate", template(config(GOOD, ["gpu"]))) == []
    assert messages("ResourceClaim", claim()) == []


@pytest.mark.parametrize(
    "params, field, message",
    [
        (
            {**GOOD, "sharing": {"strategy": "Spatial"}},
            "spec.devices.config[0].opaque.parameters",
            "spec.devices.config[0].opaque.parameters.sharing.strategy: "
            "Input should be 'TimeSlicing' or 'MPS' (got 'Spatial')",
        ),
        (
            {
                **SHARED,
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": 1}},
            },
            "spec.devices.config[0].opaque.parameters",
            "spec.devices.config[0].opaque.parameters.sharing.timeSlicingConfig.interval: "
            "Input should be 'Default', 'Short', 'Medium' or 'Long' (got 1)",
        ),
        (
            {**GOOD, "sharng": {}},
            "spec.devices.config[0].opaque.parameters",
            "spec.devices.config[0].opaque.parameters.sharng: unknown field; did you mean "
            "sharing? (allowed here: apiVersion, kind, sharing)",
        ),
        (
            {"apiVersion": V, "kind": "TpuConfig"},
            "spec.devices.config[0].opaque.parameters",
            "spec.devices.config[0].opaque.parameters.kind: 'TpuConfig' is not a config kind "
            "(did you mean GpuConfig?); use one of GpuConfig, MigDeviceConfig",
        ),
        (
            {"apiVersion": "gpu.dradriver.io/v1", "kind": "GpuConfig"},
            "spec.devices.config[0].opaque.parameters",
            "spec.devices.config[0].opaque.parameters.apiVersion: 'gpu.dradriver.io/v1' is not "
            "supported; use gpu.dradriver.io/v1alpha1",
        ),
        (
            None,
            "spec.devices.config[0].opaque.parameters",
            "spec.devices.config[0].opaque.parameters: must be an object with apiVersion and kind",
        ),
    ],
)
def test_bad_field_names_the_path_and_what_fits(params: Any, field: str, message: str) -> None:
    problems = object_problems("ResourceClaim", claim(config(params)), DRIVER)
    assert [(p.field, p.message) for p in problems] == [(field, message)]


def test_several_problems_are_all_reported_in_order() -> None:
    bad = {
        **GOOD,
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 0}},
    }
    got = messages("ResourceClaim", claim(config(GOOD), config(bad, ["gpu", "tpu"])))
    assert got == [
        "spec.devices.config[1].requests[1]: 'tpu' is not a request of this claim (did you "
        "mean gpu?); use one of gpu",
        "spec.devices.config[1].opaque.parameters.sharing.mpsConfig.defaultActiveThreadPercentage: "
        "Input should be greater than or equal to 1",
    ]


def test_config_naming_a_missing_request() -> None:
    got = messages("ResourceClaim", claim(config(GOOD, ["gpus"])))
    assert got == [
        "spec.devices.config[0].requests[0]: 'gpus' is not a request of this claim (did you "
        "mean gpu?); use one of gpu"
    ]


def test_subrequest_references() -> None:
    reqs = [PRIORITIZED, {"name": "mig", "exactly": {"deviceClassName": "mig.dradriver.io"}}]
    ok = claim(config(GOOD, ["gpu/h100", "gpu", "mig"]), requests=reqs)
    assert messages("ResourceClaim", ok) == []
    bad = claim(config(GOOD, ["gpu/l4", "mig/small", "gpu/h100/x", "gpu/"]), requests=reqs)
    allowed = "use one of gpu, gpu/h100, gpu/a100, mig"
    # The nearest name where one is close; none for a subrequest of a plain request.
    near = {"gpu/l4": "gpu", "gpu/h100/x": "gpu/h100", "gpu/": "gpu"}
    assert messages("ResourceClaim", bad) == [
        f"spec.devices.config[0].requests[{i}]: {ref!r} is not a request of this claim"
        + (f" (did you mean {near[ref]}?)" if ref in near else "")
        + f"; {allowed}"
        for i, ref in enumerate(["gpu/l4", "mig/small", "gpu/h100/x", "gpu/"])
    ]


def test_other_drivers_configs_are_ignored() -> None:
    other = config({"anything": "goes"}, ["no-such-request"], driver="other.example.com")
    assert messages("ResourceClaim", claim(other)) == []
    # Our driver name must match exactly, not as a suffix or prefix.
    assert messages("ResourceClaim", claim(config({}, driver="x.gpu.dradriver.io"))) == []
    # A configurable driver name: ours is whatever the controller was started with.
    assert devices_problems(devices(config(GOOD)), "gpu.example.com", "spec.devices") == []
    assert devices_problems(devices(config({}, driver="gpu.example.com")), "gpu.example.com", "d")


def test_templates_are_checked_under_spec_spec() -> None:
    got = messages("ResourceClaimTemplate", template(config({**GOOD, "x": 1}, ["gpux"])))
    assert got == [
        "spec.spec.devices.config[0].requests[0]: 'gpux' is not a request of this claim "
        "(did you mean gpu?); use one of gpu",
        "spec.spec.devices.config[0].opaque.parameters.x: unknown field "
        "(allowed here: apiVersion, kind, sharing)",
    ]


def test_unknown_kinds_and_odd_shapes_have_no_problems() -> None:
    assert messages("Pod", {"spec": {"devices": devices(config({}))}}) == []
    assert messages("ResourceClaim", {}) == []
    assert messages("ResourceClaim", {"spec": {"devices": {"config": "oops"}}}) == []
    # A config without opaque is someone else's concern (the API server requires it).
    assert messages("ResourceClaim", claim({"requests": ["gpu"]})) == []


def test_request_names_and_references_for_callers_outside_admission() -> None:
    d = devices(requests=[PRIORITIZED, {"name": "one"}])
    assert request_names(d) == {"gpu": ["h100", "a100"], "one": []}
    assert reference_problems(d, ["gpu/a100", "one"], "x") == []
    assert [p.field for p in reference_problems(d, ["one/sub", 7], "x")] == ["x[0]", "x[1]"]
    assert "the claim has no requests" in reference_problems({}, ["a"], "x")[0].message


def test_a_time_slice_interval_on_mig_devices_is_refused_at_admission() -> None:
    mig_sliced = {
        "apiVersion": V,
        "kind": "MigDeviceConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
    }
    (msg,) = messages("ResourceClaim", claim(config(mig_sliced)))
    assert "a time-slice interval applies to whole GPUs" in msg


SHARE_REQUEST = {
    "name": "gpu",
    "exactly": {
        "deviceClassName": "gpu.dradriver.io",
        "capacity": {"requests": {"memory": "20Gi"}},
    },
}
MPS = {"apiVersion": V, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}


@pytest.mark.parametrize("params", [SHARED, MPS])
def test_a_share_with_its_own_sharing_config_is_refused_naming_both_fields(
    params: dict[str, Any],
) -> None:
    (msg,) = messages("ResourceClaim", claim(config(params), requests=[SHARE_REQUEST]))
    assert msg.startswith("spec.devices.config[0].opaque.parameters.sharing: a ")
    assert "spec.devices.requests[0].exactly.capacity" in msg
    # A template's paths are under spec.spec; a subrequest that consumes is found too.
    prioritized = {
        "name": "gpu",
        "firstAvailable": [
            {"name": "whole", "deviceClassName": "gpu.dradriver.io"},
            {
                "name": "part",
                "deviceClassName": "gpu.dradriver.io",
                "capacity": {"requests": {"memory": "8Gi"}},
            },
        ],
    }
    (msg,) = messages(
        "ResourceClaimTemplate", template(config(params, ["gpu/part"]), requests=[prioritized])
    )
    assert "spec.spec.devices.requests[0].firstAvailable[1].capacity" in msg


def test_sharing_configs_for_other_requests_and_plain_shares_are_admitted() -> None:
    whole = {"name": "other", "exactly": {"deviceClassName": "gpu.dradriver.io"}}
    assert (
        messages("ResourceClaim", claim(config(SHARED, ["other"]), requests=[SHARE_REQUEST, whole]))
        == []
    )
    assert messages("ResourceClaim", claim(config(GOOD), requests=[SHARE_REQUEST])) == []


def test_an_unknown_field_at_admission_names_the_allowed_fields_and_the_nearest() -> None:
    """What `kubectl apply` prints for the issue's typo, under a template's spec.spec."""
    typo = {**GOOD, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPct": 50}}}
    assert messages("ResourceClaimTemplate", template(config(typo))) == [
        "spec.spec.devices.config[0].opaque.parameters.sharing.mpsConfig."
        "defaultActiveThreadPct: unknown field; did you mean defaultActiveThreadPercentage? "
        "(allowed here: defaultActiveThreadPercentage, defaultPinnedDeviceMemoryLimit, "
        "defaultPerDevicePinnedMemoryLimit)"
    ]


def test_as_nvidias_driver_its_classes_it_does_not_serve_are_refused() -> None:
    """Installed as gpu.nvidia.com (nvidiaCompatible), a request or subrequest naming an
    NVIDIA class dradriver does not serve is a problem with its path; NVIDIA's GPU and MIG
    classes are dradriver's then, and under its own name nothing of NVIDIA's is looked at."""
    claim = {
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
                    {
                        "name": "any",
                        "firstAvailable": [
                            {"name": "mig", "deviceClassName": "mig.nvidia.com"},
                            {"name": "vm", "deviceClassName": "vfio.gpu.nvidia.com"},
                        ],
                    },
                    {
                        "name": "cd",
                        "exactly": {"deviceClassName": "compute-domain-daemon.nvidia.com"},
                    },
                ]
            }
        }
    }
    problems = object_problems("ResourceClaim", claim, "gpu.nvidia.com")
    assert [p.field for p in problems] == [
        "spec.devices.requests[1].firstAvailable[1].deviceClassName",
        "spec.devices.requests[2].exactly.deviceClassName",
    ]
    assert "vfio.gpu.nvidia.com is a class of NVIDIA's DRA driver" in problems[0].message
    assert "IMEX daemon itself" in problems[1].message
    assert object_problems("ResourceClaim", claim, "gpu.dradriver.io") == []

"""The config API: strict decoding with messages that name the field, and precedence."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dradriver.api.config import (
    ConfigError,
    GpuConfig,
    MigDeviceConfig,
    decode,
    effective,
    json_schema,
)

V = "gpu.dradriver.io/v1alpha1"
REPO = Path(__file__).resolve().parents[3]


def gpu(**kw: Any) -> dict[str, Any]:
    return {"apiVersion": V, "kind": "GpuConfig", **kw}


@pytest.mark.parametrize(
    "params, message",
    [
        ([], "must be an object"),
        ({"kind": "GpuConfig"}, "apiVersion: None is not supported; use gpu.dradriver.io/v1alpha1"),
        (
            {"apiVersion": V, "kind": "Gpu"},
            "kind: 'Gpu' is not a config kind; use one of GpuConfig",
        ),
        (gpu(sharng={}), "parameters.sharng: unknown field"),
        (
            gpu(sharing={"strategy": "Spatial"}),
            "sharing.strategy: Input should be 'TimeSlicing' or 'MPS' (got 'Spatial')",
        ),
        (
            gpu(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Fast"}}),
            "timeSlicingConfig.interval: Input should be 'Default', 'Short', 'Medium' or 'Long'",
        ),
        (
            gpu(sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 0}}),
            "defaultActiveThreadPercentage: Input should be greater than or equal to 1",
        ),
        (
            gpu(
                sharing={"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1 GB"}}
            ),
            "defaultPinnedDeviceMemoryLimit: '1 GB' is not a quantity",
        ),
        (
            gpu(
                sharing={
                    "strategy": "MPS",
                    "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"gpu0": "1Gi"}},
                }
            ),
            "key 'gpu0' must be a device index or a GPU-/MIG- UUID",
        ),
        (
            gpu(sharing={"strategy": "MPS", "timeSlicingConfig": {}}),
            "timeSlicingConfig is only allowed with strategy TimeSlicing",
        ),
    ],
)
def test_bad_configs_name_the_field_and_what_fits(params: Any, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        decode(params)
    assert message in str(err.value)


def test_good_configs_and_defaults() -> None:
    c = decode(gpu(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {}}))
    assert isinstance(c, GpuConfig) and c.sharing is not None
    assert (
        c.sharing.timeSlicingConfig is not None
        and c.sharing.timeSlicingConfig.interval == "Default"
    )
    assert decode(gpu()).sharing is None  # no sharing unless asked for
    m = decode(
        {
            "apiVersion": V,
            "kind": "MigDeviceConfig",
            "sharing": {
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultActiveThreadPercentage": 50,
                    "defaultPerDevicePinnedMemoryLimit": {"0": "5Gi"},
                },
            },
        }
    )
    assert isinstance(m, MigDeviceConfig)


def test_precedence_later_wins_and_kind_must_fit() -> None:
    ts = gpu(sharing={"strategy": "TimeSlicing"})
    mps = gpu(sharing={"strategy": "MPS"})
    mig = {"apiVersion": V, "kind": "MigDeviceConfig"}
    assert effective([], "gpu", "r") is None
    got = effective([ts, mps], "gpu", "r")
    assert got is not None and got.sharing is not None and got.sharing.strategy == "MPS"
    got = effective([mps, ts], "gpu", "r")
    assert got is not None and got.sharing is not None and got.sharing.strategy == "TimeSlicing"
    # A MIG config next to a GPU config: each device takes the one of its kind.
    assert isinstance(effective([ts, mig], "mig", "r"), MigDeviceConfig)
    assert isinstance(effective([ts, mig], "gpu", "r"), GpuConfig)
    with pytest.raises(
        ConfigError, match="GpuConfig does not fit a mig device; use MigDeviceConfig"
    ):
        effective([ts], "mig", "r")
    with pytest.raises(ConfigError, match="config for request 'r'"):
        effective([gpu(bogus=1)], "gpu", "r")


def test_json_schema_is_generated_and_committed() -> None:
    committed = REPO / "api" / "config" / "v1alpha1.schema.json"
    assert committed.exists(), "run `make schema`"
    assert json.loads(committed.read_text()) == json_schema(), "api/ drifted: run `make schema`"


def test_a_mig_device_config_with_a_time_slice_interval_is_refused_at_decode() -> None:
    """So the admission webhook refuses it at `kubectl apply`, not only prepare."""
    from dradriver.api.config import ConfigError, decode

    params = {
        "apiVersion": "gpu.dradriver.io/v1alpha1",
        "kind": "MigDeviceConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}},
    }
    with pytest.raises(ConfigError, match="a time-slice interval applies to whole GPUs"):
        decode(params)
    params["sharing"] = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}
    assert decode(params).kind == "MigDeviceConfig"


def mps(**cfg: Any) -> dict[str, Any]:
    return gpu(sharing={"strategy": "MPS", "mpsConfig": cfg})


def _deep(levels: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cur = out
    for _ in range(levels):
        cur["a"] = {}
        cur = cur["a"]
    return out


@pytest.mark.parametrize(
    ("params", "message"),
    [
        # Strict means strict: what a YAML slip or a templating bug produces is refused.
        (mps(defaultActiveThreadPercentage="50"), "got '50': write the number itself"),
        (mps(defaultActiveThreadPercentage=True), "got True"),
        (mps(defaultActiveThreadPercentage=50.0), "got 50.0"),
        (
            mps(defaultPinnedDeviceMemoryLimit="0"),
            "'0': a pinned memory limit must be at least 1Mi",
        ),
        (mps(defaultPerDevicePinnedMemoryLimit={"0": "0Mi"}), "at least 1Mi"),
        (mps(defaultPinnedDeviceMemoryLimit="9" * 40), "larger than a quantity can be"),
        (mps(defaultPinnedDeviceMemoryLimit="9" * 400), "is not a quantity"),
        (mps(defaultPinnedDeviceMemoryLimit="1Gi\n"), "is not a quantity"),
        # A key lands in CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="k=v,k=v": no forged entries.
        (mps(defaultPerDevicePinnedMemoryLimit={"GPU-1,0=1M": "1Gi"}), "key 'GPU-1,0=1M' must be"),
        (mps(defaultPerDevicePinnedMemoryLimit={"0=1M": "1Gi"}), "must be a device index"),
        (mps(defaultPerDevicePinnedMemoryLimit={"GPU-a\n": "1Gi"}), "must be a device index"),
        (mps(x=_deep(5000)), "parameters.sharing.mpsConfig.x.a.a.a"),
    ],
)
def test_strict_numbers_keys_and_limits(params: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        decode(params)
    assert message in str(info.value)
    assert len(str(info.value)) < 600  # a message, not a dump of the input


def test_deep_nesting_is_named_not_a_recursion_error() -> None:
    with pytest.raises(ConfigError) as info:
        decode(mps(x=_deep(5000)))
    assert "nested more than 64 levels deep" in str(info.value)


def test_valid_limits_still_decode() -> None:
    cfg = decode(
        mps(
            defaultActiveThreadPercentage=50,
            defaultPinnedDeviceMemoryLimit="1.5Gi",
            defaultPerDevicePinnedMemoryLimit={"0": "1Mi", "MIG-GPU-abc/1/0": "2Gi"},
        )
    )
    assert isinstance(cfg, GpuConfig) and cfg.sharing is not None
    assert cfg.sharing.mpsConfig is not None
    assert cfg.sharing.mpsConfig.defaultActiveThreadPercentage == 50


def test_quantities_are_exact_integers() -> None:
    from dradriver.api.config import quantity_bytes

    assert quantity_bytes("1.5Gi") == 3 * 2**29
    assert quantity_bytes("7Ei") == 7 * 2**60
    with pytest.raises(ValueError, match="larger than"):
        quantity_bytes("8Ei")


def _refusal(params: Any) -> str:
    with pytest.raises(ConfigError) as info:
        decode(params)
    return str(info.value)


MPS_FIELDS = (
    "defaultActiveThreadPercentage, defaultPinnedDeviceMemoryLimit, "
    "defaultPerDevicePinnedMemoryLimit"
)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        # The case: the allowed names of the object it is in, and the nearest.
        (
            mps(defaultActiveThreadPercent=50),
            "parameters.sharing.mpsConfig.defaultActiveThreadPercent: unknown field; did you "
            f"mean defaultActiveThreadPercentage? (allowed here: {MPS_FIELDS})",
        ),
        (
            gpu(sharng={}),
            "parameters.sharng: unknown field; did you mean sharing? "
            "(allowed here: apiVersion, kind, sharing)",
        ),
        # The same name in another case is the nearest, whatever the spelling distance.
        (
            gpu(sharing={"strategy": "MPS", "MPSCONFIG": {}}),
            "parameters.sharing.MPSCONFIG: unknown field; did you mean mpsConfig? "
            "(allowed here: strategy, timeSlicingConfig, mpsConfig)",
        ),
        # A field of the API written one level too high says where it belongs.
        (
            gpu(mpsConfig={}),
            "parameters.mpsConfig: unknown field; mpsConfig belongs under sharing "
            "(allowed here: apiVersion, kind, sharing)",
        ),
        # Nothing close: the allowed names alone, no guess.
        (
            mps(colour="red"),
            f"parameters.sharing.mpsConfig.colour: unknown field (allowed here: {MPS_FIELDS})",
        ),
        # Values and kinds in another case or slightly misspelt.
        (
            gpu(sharing={"strategy": "mps"}),
            "parameters.sharing.strategy: Input should be 'TimeSlicing' or 'MPS' "
            "(got 'mps'; did you mean MPS?)",
        ),
        (
            {"apiVersion": V, "kind": "GPUConfig"},
            "parameters.kind: 'GPUConfig' is not a config kind (did you mean GpuConfig?); "
            "use one of GpuConfig, MigDeviceConfig",
        ),
    ],
)
def test_an_unknown_field_or_value_names_what_is_allowed_and_the_nearest(
    params: Any, message: str
) -> None:
    assert _refusal(params) == message


def test_per_device_limit_keys_are_free_names_not_fields() -> None:
    """A map's keys are the user's (device indices, UUIDs): never "unknown field"."""
    text = _refusal(mps(defaultPerDevicePinnedMemoryLimit={"0": "1Gi", "GPU-x": "1Kb"}))
    assert "unknown field" not in text and "'1Kb' is not a quantity" in text


def test_a_prepare_time_error_names_the_request_then_the_field() -> None:
    """What the kubelet shows when no webhook refused the config at apply time."""
    with pytest.raises(ConfigError) as info:
        effective([mps(defaultActiveThreadPercent=50)], "gpu", "gpu")
    assert str(info.value) == (
        "config for request 'gpu': parameters.sharing.mpsConfig.defaultActiveThreadPercent: "
        f"unknown field; did you mean defaultActiveThreadPercentage? (allowed here: {MPS_FIELDS})"
    )


def test_nvidias_config_api_is_read_as_ours_and_its_other_kinds_are_refused_by_name() -> None:
    """Manifests written for NVIDIA's DRA driver (resource.nvidia.com/v1beta1) keep working:
    its GpuConfig and MigDeviceConfig have our shape; what dradriver does not do is named."""
    nvidia = "resource.nvidia.com/v1beta1"
    mps = {
        "apiVersion": nvidia,
        "kind": "GpuConfig",
        "sharing": {
            "strategy": "MPS",
            "mpsConfig": {
                "defaultActiveThreadPercentage": 50,
                "defaultPinnedDeviceMemoryLimit": "10Gi",
            },
        },
    }
    got = decode(mps)
    assert isinstance(got, GpuConfig) and got.sharing is not None
    assert got.sharing.mpsConfig is not None
    assert got.sharing.mpsConfig.defaultActiveThreadPercentage == 50
    ts = {"apiVersion": nvidia, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing",
          "timeSlicingConfig": {"interval": "Long"}}}  # fmt: skip
    assert decode(ts).sharing is not None
    assert decode({"apiVersion": nvidia, "kind": "MigDeviceConfig"}).kind == "MigDeviceConfig"
    # multiUser false is what NVIDIA's driver does by default; true is refused with why.
    mps["sharing"]["mpsConfig"]["multiUser"] = False  # type: ignore[index]
    decode(mps)
    mps["sharing"]["mpsConfig"]["multiUser"] = True  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"mpsConfig\.multiUser: MPS for several users"):
        decode(mps)
    for kind, why in (
        ("VfioDeviceConfig", "passthrough"),
        ("ComputeDomainChannelConfig", "ComputeDomains write their own channel config"),
        ("ComputeDomainDaemonConfig", "IMEX daemon itself"),
    ):
        with pytest.raises(ConfigError, match=f"{kind} of {nvidia}.*not supported: .*{why}"):
            decode({"apiVersion": nvidia, "kind": kind, "domainID": "x"})
    with pytest.raises(ConfigError, match=r"resource\.nvidia\.com/v1beta1 for GpuConfig"):
        decode({"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"})

"""The config API's messages: bounded whatever a config holds, and a hint for the type
of value written where another was wanted."""

from __future__ import annotations

from typing import Any

import pytest

from dradriver.api.config import API_VERSION, NVIDIA_API_VERSION, ConfigError, decode

BIG = "k" * 100_000
# What any message stays within (echo.MAX_MESSAGE), written out: the test states the promise.
KB = 1024


def gpu(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "GpuConfig", **fields}


def mps(**cfg: Any) -> dict[str, Any]:
    return gpu(sharing={"strategy": "MPS", "mpsConfig": cfg})


def refusal(params: Any, where: str = "parameters") -> str:
    with pytest.raises(ConfigError) as info:
        decode(params, where)
    return str(info.value)


@pytest.mark.parametrize(
    ("params", "said"),
    [
        (gpu(**{BIG: 1}), "parameters.kkkk"),
        ({"apiVersion": API_VERSION, "kind": BIG}, "parameters.kind: 'kkkk"),
        ({"apiVersion": BIG, "kind": "GpuConfig"}, "parameters.apiVersion: 'kkkk"),
        (mps(defaultPerDevicePinnedMemoryLimit={BIG: "1Gi"}), "key 'kkkk"),
        (mps(defaultPerDevicePinnedMemoryLimit={BIG: 5}), "defaultPerDevicePinnedMemoryLimit.kk"),
        (gpu(sharing={"strategy": BIG}), "(got 'kkkk"),
    ],
)
def test_a_100kb_value_is_shortened_and_its_length_said(params: Any, said: str) -> None:
    message = refusal(params)
    assert said in message and "(100000 characters)" in message
    assert len(message) <= 300


def test_no_message_is_longer_than_the_bound_whatever_the_config() -> None:
    many = gpu(**{f"x{i}": 1 for i in range(500)})
    message = refusal(many)
    assert len(message) <= KB and message.endswith("; and 495 more")
    long_keys = gpu(**{f"{i}{BIG}": 1 for i in range(50)})
    assert len(refusal(long_keys, where="spec.devices.config[0]." + "x" * 5000)) <= KB
    # Not a repr of the list: only its type.
    assert "list is not supported" in refusal({"apiVersion": [BIG] * 100, "kind": "GpuConfig"})


def test_a_kind_that_is_not_a_string_is_refused_not_a_type_error() -> None:
    message = refusal({"apiVersion": NVIDIA_API_VERSION, "kind": [BIG]})
    assert message.startswith("parameters.kind: list is not a config kind")


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ("50", "got '50': write the number itself, unquoted"),
        (50.0, "got 50.0: write a whole number from 1 to 100, 50 rather than 50.0"),
        (50.5, "got 50.5: write a whole number from 1 to 100)"),
        (True, "got True: true and false are not numbers; write a whole number from 1 to 100"),
        ("fifty", "got 'fifty': write a whole number from 1 to 100)"),
        ([50], "got list: write a whole number from 1 to 100)"),
    ],
)
def test_a_number_field_says_what_to_write_for_what_was_written(value: Any, hint: str) -> None:
    message = refusal(mps(defaultActiveThreadPercentage=value))
    assert hint in message
    if not isinstance(value, str) or not value.isdigit():
        assert "unquoted" not in message


@pytest.mark.parametrize(
    ("params", "hint"),
    [
        (
            mps(defaultPinnedDeviceMemoryLimit=1024),
            "got 1024: write a quantity such as 512Mi or 10Gi, or a number of bytes in quotes",
        ),
        (
            mps(defaultPinnedDeviceMemoryLimit=True),
            "got True: true and false are not quantities; write a quantity such as 512Mi",
        ),
        (
            mps(defaultPerDevicePinnedMemoryLimit={"0": 1.5}),
            "got 1.5: write a quantity such as 512Mi or 10Gi)",
        ),
        (
            mps(defaultPerDevicePinnedMemoryLimit="5Gi"),
            "got '5Gi': write an object of key: value pairs",
        ),
        (
            {
                "apiVersion": API_VERSION,
                "kind": "ComputeDomainChannelConfig",
                "domain": "d",
                "domainUID": "00000000-0000-0000-0000-000000000000",
                "channel": 3.0,
            },
            "got 3.0: write a whole number from 0 to 2047, 3 rather than 3.0",
        ),
    ],
)
def test_quantity_object_and_channel_fields_say_what_fits(params: Any, hint: str) -> None:
    message = refusal(params)
    assert hint in message and "unquoted" not in message

"""The config API's objects as pydantic models: the kinds, their fields and the rules
each value must meet, with the JSON Schema generated from them. Its own file because
this is the contract itself: the webhook and prepare decode with these models, the
committed schema is made from them, and a change here is a change to the API.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dradriver.api.echo import echo
from dradriver.api.units import WHOLE

QUANTITY = re.compile(r"^([0-9]+(\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")

# Kubernetes quantities stop at 2^63 - 1; so do ours (no float on the way: "9" * 400
# must be an error, not an OverflowError or inf).
MAX_QUANTITY = 2**63 - 1
# MPS takes pinned-memory limits in whole MiB ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=512M").
MIN_PINNED = 2**20


def quantity_bytes(q: str) -> int:
    m = QUANTITY.fullmatch(q) if isinstance(q, str) and len(q) <= 64 else None
    if not m:
        raise ValueError(f"{echo(q)} is not a quantity such as 512Mi or 10Gi")
    whole, _, frac = m.group(1).partition(".")
    unit = WHOLE[m.group(3) or ""]
    value = int(whole) * unit + (int(frac) * unit // 10 ** len(frac) if frac else 0)
    if value > MAX_QUANTITY:
        raise ValueError(f"{echo(q)} is larger than a quantity can be (2^63-1 bytes)")
    return value


def pinned_bytes(q: str) -> int:
    """A pinned-memory limit: a quantity of at least 1Mi."""
    n = quantity_bytes(q)
    if n < MIN_PINNED:
        raise ValueError(
            f"{echo(q)}: a pinned memory limit must be at least 1Mi (MPS counts in MiB)"
        )
    return n


# A per-device limit key: an index, or a GPU-/MIG- UUID (MIG-GPU-<uuid>/<gi>/<ci> included).
# Nothing else: the key is written into CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, where ",", "="
# or a newline would forge another entry.
DEVICE_KEY = re.compile(r"^(?:[0-9]{1,3}|(?:GPU|MIG)-[A-Za-z0-9/-]{1,80})$")


class _Strict(BaseModel):
    # strict: "50", 50.0 and true are not 50; a config says what it means.
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=False, strict=True)


class TimeSlicingConfig(_Strict):
    interval: Literal["Default", "Short", "Medium", "Long"] = "Default"


Quantity = Annotated[str, Field(description="a quantity such as 512Mi or 10Gi")]


class MpsConfig(_Strict):
    defaultActiveThreadPercentage: Annotated[int, Field(ge=1, le=100)] | None = None
    defaultPinnedDeviceMemoryLimit: Quantity | None = None
    defaultPerDevicePinnedMemoryLimit: dict[str, Quantity] | None = None

    @field_validator("defaultPinnedDeviceMemoryLimit")
    @classmethod
    def _q(cls, v: str | None) -> str | None:
        if v is not None:
            pinned_bytes(v)
        return v

    @field_validator("defaultPerDevicePinnedMemoryLimit")
    @classmethod
    def _per_device(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        for key, q in (v or {}).items():
            if not DEVICE_KEY.fullmatch(key):
                raise ValueError(
                    f"key {echo(key)} must be a device index or a GPU-/MIG- UUID "
                    "(letters, digits, '-' and '/' only)"
                )
            pinned_bytes(q)
        return v


class Sharing(_Strict):
    strategy: Literal["TimeSlicing", "MPS"]
    timeSlicingConfig: TimeSlicingConfig | None = None
    mpsConfig: MpsConfig | None = None

    @model_validator(mode="after")
    def _matches_strategy(self) -> Sharing:
        if self.strategy == "TimeSlicing" and self.mpsConfig is not None:
            raise ValueError("mpsConfig is only allowed with strategy MPS")
        if self.strategy == "MPS" and self.timeSlicingConfig is not None:
            raise ValueError("timeSlicingConfig is only allowed with strategy TimeSlicing")
        return self


class GpuConfig(_Strict):
    apiVersion: Literal["gpu.dradriver.io/v1alpha1", "resource.nvidia.com/v1beta1"]
    kind: Literal["GpuConfig"]
    sharing: Sharing | None = None


class MigDeviceConfig(_Strict):
    apiVersion: Literal["gpu.dradriver.io/v1alpha1", "resource.nvidia.com/v1beta1"]
    kind: Literal["MigDeviceConfig"]
    sharing: Sharing | None = None

    @model_validator(mode="after")
    def _no_interval(self) -> MigDeviceConfig:
        # A time-slice interval is a whole GPU's setting; refused here, so that
        # `kubectl apply` refuses it too, not only prepare.
        ts = self.sharing.timeSlicingConfig if self.sharing else None
        if ts is not None and ts.interval != "Default":
            raise ValueError(
                "sharing.timeSlicingConfig.interval: a time-slice interval applies to whole "
                "GPUs; MIG devices are time-sliced by the driver without one (use interval "
                "Default, or MPS)"
            )
        return self


# A ComputeDomain's metadata.uid: what the API server generates (RFC 4122, lowercase).
UID = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"


class ComputeDomainChannelConfig(_Strict):
    """The IMEX channel a claim asks for belongs to this ComputeDomain. The controller
    writes it into the domain's ResourceClaimTemplate; a claim's spec cannot change
    afterwards, so the node trusts it over labels anyone with edit rights may change."""

    apiVersion: Literal["gpu.dradriver.io/v1alpha1"]
    kind: Literal["ComputeDomainChannelConfig"]
    domain: Annotated[str, Field(min_length=1, max_length=253)]
    domainUID: Annotated[str, Field(pattern=UID)]
    # The domain's IMEX channel: the same number on every node of it.
    channel: Annotated[int, Field(ge=0, le=2047)]

    @property
    def sharing(self) -> None:
        """A channel is never shared between domains and has no sharing settings."""
        return None


DeviceConfig = GpuConfig | MigDeviceConfig | ComputeDomainChannelConfig
KINDS: dict[str, type[GpuConfig] | type[MigDeviceConfig] | type[ComputeDomainChannelConfig]] = {
    "GpuConfig": GpuConfig,
    "MigDeviceConfig": MigDeviceConfig,
    "ComputeDomainChannelConfig": ComputeDomainChannelConfig,
}
# The kinds a user writes: the channel config is the controller's, never suggested.
USER_KINDS = ("GpuConfig", "MigDeviceConfig")
# Which config kind fits which device type attribute.
KIND_FOR_TYPE = {
    "gpu": "GpuConfig",
    "mig": "MigDeviceConfig",
    "imex-channel": "ComputeDomainChannelConfig",
}


def json_schema() -> dict[str, Any]:
    """The API's JSON Schema (api/config/v1alpha1.schema.json is generated from this)."""
    from pydantic.json_schema import models_json_schema

    _, schema = models_json_schema(
        [
            (GpuConfig, "validation"),
            (MigDeviceConfig, "validation"),
            (ComputeDomainChannelConfig, "validation"),
        ],
        title="gpu.dradriver.io/v1alpha1 device configuration",
    )
    return schema

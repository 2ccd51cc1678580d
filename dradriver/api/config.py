"""The opaque device configuration API, gpu.dradriver.io/v1alpha1.

A claim (or a DeviceClass) carries these objects in `config[].opaque.parameters`.
Decoding is strict: unknown fields are errors, every message names the field path and
the allowed values, and nothing is shared unless a config says so.

    apiVersion: gpu.dradriver.io/v1alpha1   # or NVIDIA's resource.nvidia.com/v1beta1
    kind: GpuConfig            # whole GPUs; MigDeviceConfig for MIG devices
                               # (ComputeDomainChannelConfig: written by the controller
                               # into a ComputeDomain's claim template, never by hand)
    sharing:                   # omitted: the device is exclusive to the claim
      strategy: TimeSlicing    # or MPS
      timeSlicingConfig:
        interval: Default      # Default | Short | Medium | Long
      mpsConfig:
        defaultActiveThreadPercentage: 50            # 1..100
        defaultPinnedDeviceMemoryLimit: 10Gi         # a quantity
        defaultPerDevicePinnedMemoryLimit:           # by device UUID or index
          "0": 5Gi

What a refusal says is in config_messages.py; this module holds the objects, their
rules and JSON Schema, and where configs are read (decode, effective).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dradriver.api.config_messages import refusal
from dradriver.api.depth import nesting_message, too_deep
from dradriver.api.echo import MAX_MESSAGE, bounded, echo
from dradriver.api.suggest import nearest
from dradriver.api.units import WHOLE
from dradriver.errors import ConfigError

__all__ = [
    "API_VERSION",
    "NVIDIA_API_VERSION",
    "ComputeDomainChannelConfig",
    "ConfigError",
    "DeviceConfig",
    "GpuConfig",
    "MigDeviceConfig",
    "decode",
]

API_VERSION = "gpu.dradriver.io/v1alpha1"
# NVIDIA's DRA driver's config API: its GpuConfig and MigDeviceConfig have the shape of
# ours, so manifests written for it are read as they are (docs/user-guide.md, "Coming from NVIDIA's
# DRA driver"); its other kinds are refused by name.
NVIDIA_API_VERSION = "resource.nvidia.com/v1beta1"
NVIDIA_UNSUPPORTED = {
    "VfioDeviceConfig": "GPU passthrough to virtual machines (VFIO) is not something "
    "dradriver prepares",
    "ComputeDomainChannelConfig": "dradriver's ComputeDomains write their own channel "
    "config into the domain's claim template (docs/user-guide.md, Multi-node NVLink)",
    "ComputeDomainDaemonConfig": "dradriver runs a ComputeDomain's IMEX daemon itself; "
    "there is no daemon device to configure",
}


def _from_nvidia(params: dict[str, Any], where: str) -> dict[str, Any]:
    """NVIDIA's GpuConfig or MigDeviceConfig as ours: the same but for mpsConfig's
    multiUser, whose default (false) is what dradriver does and whose true it does not."""
    sharing = params.get("sharing")
    if not isinstance(sharing, dict):
        return params
    mps = sharing.get("mpsConfig")
    if not isinstance(mps, dict) or "multiUser" not in mps:
        return params
    if mps["multiUser"] is not False:
        raise ConfigError(
            f"{where}.sharing.mpsConfig.multiUser: MPS for several users is not supported: "
            "dradriver runs one MPS daemon per shared device, as the containers' user; "
            "leave multiUser out (or false)",
            reason="config",
        )
    rest = {k: v for k, v in mps.items() if k != "multiUser"}
    return {**params, "sharing": {**sharing, "mpsConfig": rest}}


def decode(params: Any, where: str = "parameters") -> DeviceConfig:
    """Decodes one opaque config, or raises ConfigError naming the field and what fits,
    in at most MAX_MESSAGE characters whatever the config holds."""
    try:
        return _decode(params, where)
    except ConfigError as exc:
        if len(str(exc)) <= MAX_MESSAGE:
            raise
        # Not chained: the cause's text is the unbounded one.
        raise exc.retold(bounded(str(exc))) from None


def _decode(params: Any, where: str) -> DeviceConfig:
    if not isinstance(params, dict):
        raise ConfigError(f"{where}: must be an object with apiVersion and kind")
    deep = too_deep(params)
    if deep is not None:
        raise ConfigError(f"{where}.{nesting_message(deep)}", reason="config")
    kind, version = params.get("kind"), params.get("apiVersion")
    # Any JSON value may stand where a kind belongs; a list is not even hashable.
    name = kind if isinstance(kind, str) else ""
    if version == NVIDIA_API_VERSION and name in NVIDIA_UNSUPPORTED:
        raise ConfigError(
            f"{where}.kind: {kind} of {NVIDIA_API_VERSION} (NVIDIA's DRA driver) is not "
            f"supported: {NVIDIA_UNSUPPORTED[name]}; GpuConfig and MigDeviceConfig are",
            reason="config",
        )
    if version == NVIDIA_API_VERSION:
        params = _from_nvidia(params, where)
    if version not in (API_VERSION, NVIDIA_API_VERSION):
        nvidias = isinstance(version, str) and version.startswith("resource.nvidia.com/")
        also = f" (or {NVIDIA_API_VERSION} for GpuConfig and MigDeviceConfig)" if nvidias else ""
        raise ConfigError(
            f"{where}.apiVersion: {echo(version)} is not supported; use {API_VERSION}{also}"
        )
    model = KINDS.get(name)
    if model is None:
        close = nearest(name, USER_KINDS) if name else None
        hint = f" (did you mean {close}?)" if close else ""
        raise ConfigError(
            f"{where}.kind: {echo(kind)} is not a config kind{hint}; "
            f"use one of {', '.join(USER_KINDS)}"
        )
    try:
        return model.model_validate(params)
    except ValidationError as exc:
        raise ConfigError(refusal(model, exc, where), reason="config") from exc


def effective(configs: list[dict[str, Any]], device_type: str, request: str) -> DeviceConfig | None:
    """The config for one device: the last one of the kind that fits its type wins.
    Configs exist but none fits -> an error, since silently ignoring them would run the
    device with a policy nobody asked for."""
    want = KIND_FOR_TYPE.get(device_type)
    # "config for request 'gpu': parameters.sharing...": the request, then the path in it.
    decoded = [decode(c, f"config for request {request!r}: parameters") for c in configs]
    fitting = [c for c in decoded if c.kind == want]
    if fitting:
        return fitting[-1]
    if decoded:
        kinds = sorted({c.kind for c in decoded})
        raise ConfigError(
            f"config for request {request!r}: {', '.join(kinds)} does not fit a "
            f"{device_type} device; use {want}"
        )
    return None


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

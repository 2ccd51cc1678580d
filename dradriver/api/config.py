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

The objects themselves are in config_models.py, what a refusal says in
config_messages.py; this module is where configs are read (decode, effective).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from dradriver.api.config_messages import refusal

# The kinds are re-exported (__all__): callers know them as the config API's names.
from dradriver.api.config_models import (
    KIND_FOR_TYPE,
    KINDS,
    USER_KINDS,
    ComputeDomainChannelConfig,
    DeviceConfig,
    GpuConfig,
    MigDeviceConfig,
)

# The Makefile's `schema` target calls dradriver.api.config.json_schema: a contract.
from dradriver.api.config_models import json_schema as json_schema
from dradriver.api.depth import nesting_message, too_deep
from dradriver.api.echo import MAX_MESSAGE, bounded, echo
from dradriver.api.suggest import nearest
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

"""The driver's errors: one type per layer a failure can come from, each carrying a short
`reason` (the metric label and the log's `reason=`) and a message written for the user
who reads it in a pod's events. The layer is the type, not a text prefix; the message
still names it where that helps a reader ("MIG layer: ...")."""

from __future__ import annotations

from typing import ClassVar, Self


class DriverError(Exception):
    """A failure the driver explains: `layer` says where, `reason` what, briefly."""

    layer: ClassVar[str] = "driver"

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or self.layer.lower()

    @property
    def message(self) -> str:
        return str(self)

    def retold(self, message: str) -> Self:
        """The same error (type, reason and every attribute) with a message that says
        more, such as which claim it concerns; chain it `from` the original."""
        # Not copy.copy: subclasses' constructors take other arguments.
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.args = (message,)
        return new


class RequestError(DriverError):
    """What the kubelet sent cannot be used (a malformed claim reference)."""

    layer = "request"


class ClaimStateError(DriverError):
    """The claim is not (or no longer) in a state this node can prepare: replaced, not
    allocated, not reserved, being deleted, or without a device of this driver."""

    layer = "claim"


class ApiError(DriverError):
    """The API server could not be asked (or answered with an error)."""

    layer = "API"


class ConfigError(DriverError, ValueError):
    """A claim's or class's opaque config for this driver is invalid or does not apply."""

    layer = "config"


class DeviceError(DriverError):
    """A device cannot be given: not published here, or held by another claim."""

    layer = "device"


class MigError(DriverError):
    """An NVML call that creates, destroys or switches MIG failed."""

    layer = "MIG"

    def __init__(self, message: str, *, in_use: bool = False, reason: str = "") -> None:
        super().__init__(message, reason=reason or ("in_use" if in_use else "mig"))
        self.in_use = in_use  # a process still uses the instance: retry later


class SharingError(DriverError):
    """Time-slicing or MPS could not be set up or undone."""

    layer = "sharing"


class ImexError(DriverError):
    """A ComputeDomain's IMEX channel cannot be prepared on this node (yet): the domain is
    not found or not this node's, its other nodes have not joined, or the node's IMEX
    daemon did not get ready."""

    layer = "IMEX"


class DaemonError(DriverError):
    """A daemon a claim depends on (MPS, IMEX), which runs as a pod of its own, could not
    be created, did not start, or could not be stopped."""

    layer = "daemon"


class CdiError(DriverError, OSError):
    """A CDI spec could not be written or removed."""

    layer = "CDI"


class CheckpointError(DriverError):
    """The checkpoint could not be written (disk full, read-only state directory)."""

    layer = "checkpoint"


def internal_error(claim: str, exc: Exception) -> DriverError:
    """An exception no layer turned into a DriverError, as this claim's error: the log
    has the traceback for a bug report."""
    if isinstance(exc, RecursionError):
        return DriverError(
            f"claim {claim}: the claim nests too deeply to be read; simplify its parameters",
            reason="too_deep",
        )
    text = str(exc)
    text = text if len(text) <= 300 else text[:300] + "..."
    return DriverError(
        f"claim {claim}: internal error ({type(exc).__name__}: {text}); this is a bug in "
        "dradriver, please report it with the plugin's log",
        reason="internal",
    )

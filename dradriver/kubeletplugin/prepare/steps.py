"""A claim's hardware work as steps of one shape (each applied to the claim's record and
undone, idempotently, from the record as it last stood), and the one runner that undoes
them on every path that takes a claim back. The runner's policy: docs/design.md,
"Prepare: read, plan, apply, record".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dradriver.errors import CdiError, CheckpointError, DriverError
from dradriver.kubeletplugin.state.records import ClaimRecord
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.steps")

# How a layer's failure is prefixed in the claim's error (the CDI and checkpoint
# layers' own errors say it already).
LAYERS = {"MIG": "MIG layer: ", "sharing": "sharing layer: ", "IMEX": "IMEX layer: "}


def unchanged(rec: ClaimRecord) -> ClaimRecord:
    """A step with nothing to apply."""
    return rec


def nothing(rec: ClaimRecord) -> None:
    """A step with nothing to undo."""


def ignoring(undo: Callable[[], object]) -> Callable[[ClaimRecord], object]:
    """An undo that finds what it undoes in a ledger, not in the record."""
    return lambda rec: undo()


@dataclass(frozen=True)
class Step:
    layer: str  # what an error names: "MIG", "sharing", "shares", "IMEX", "CDI"
    what: str  # for the log: "destroy MIG device gpu-0-mig-1g10gb-0"
    undo: Callable[[ClaimRecord], object]
    apply: Callable[[ClaimRecord], ClaimRecord] = unchanged


def layered(exc: Exception, claim: str) -> DriverError:
    """A step's failure as the per-claim error the kubelet shows, naming the layer."""
    if isinstance(exc, DriverError):
        return exc.retold(f"claim {claim}: {LAYERS.get(exc.layer, '')}{exc}")
    if isinstance(exc, OSError):
        return CheckpointError(f"claim {claim}: checkpoint layer: {exc}", reason="checkpoint")
    if isinstance(exc, ValueError):
        return CdiError(f"claim {claim}: {exc}", reason="cdi_spec")
    return DriverError(f"claim {claim}: {type(exc).__name__}: {exc}", reason="other")


def apply_all(
    steps: Sequence[Step], rec: ClaimRecord, progress: Callable[[ClaimRecord], None]
) -> ClaimRecord:
    """Each step's apply, in order, each on the record the one before left, which
    `progress` hears of; the first failure is raised as it came."""
    for step in steps:
        rec = step.apply(rec)
        progress(rec)
    return rec


def undo_all(steps: Sequence[Step], rec: ClaimRecord) -> DriverError | None:
    """Every step's undo on `rec`, the last applied first (see the module's policy).
    Returns the first failure as the claim's error, or None when all is undone."""
    first: DriverError | None = None
    claim, uid = rec.ref, rec.uid
    for step in reversed(steps):
        try:
            step.undo(rec)
        except (DriverError, OSError, ValueError) as exc:
            err = _undo_failed(step, exc, claim)
            log.error(
                "could not undo a step",
                claim=claim,
                claim_uid=uid,
                step=step.what,
                layer=step.layer,
                error=str(exc),
            )
            first = first or err
    return first


def _undo_failed(step: Step, exc: Exception, claim: str) -> DriverError:
    if isinstance(exc, DriverError):
        hint = " (a process still uses it)" if getattr(exc, "in_use", False) else ""
        prefix = LAYERS.get(exc.layer, "")
        return exc.retold(f"claim {claim}: {prefix}{step.what}: {exc}{hint}; the kubelet retries")
    if step.layer == "CDI":
        return CdiError(f"CDI layer: {step.what} of claim {claim} failed: {exc}", reason="cdi")
    return layered(exc, claim)

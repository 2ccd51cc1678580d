"""What each Kubernetes line from 1.34 to 1.37 gives a DRA driver, as plain facts (pure).

Read in k8s.io/kubernetes v1.34.4, v1.35.4, v1.36.3 and v1.37.2 (paths are inside those
modules): the feature gates' defaults in pkg/features/kube_features.go, the ResourceSlice
rules in pkg/apis/resource/validation/validation.go and k8s.io/api resource/v1/types.go,
the allocator's order in k8s.io/dynamic-resource-allocation structured/internal, and the
claim-status authorization in pkg/registry/resource/utils.go. The slice layout, the
chart's grants, `dradriver doctor` and the local control plane's gates all come from here,
so a new line is one more row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


class LineError(ValueError):
    """A Kubernetes version this driver knows nothing of (or not a version at all)."""


@dataclass(frozen=True)
class Feature:
    """A DRA feature the driver builds on, behind a gate of the same name."""

    gate: str
    what: str  # what the driver does with it, for doctor and the README
    on_by_default_from: int = 36  # the first minor whose default turns it on
    # Where the gate must be on while it is off by default.
    components: str = "kube-apiserver, kube-scheduler, kube-controller-manager"


# The gates this driver uses. Before `on_by_default_from` a cluster turns them on itself,
# on every component named (a gate on the API server alone lets fields in that the
# scheduler ignores). 1.36 made them beta and on by default; 1.37 made DRADeviceTaints
# and DRAExtendedResource GA (locked on).
FEATURES: tuple[Feature, ...] = (
    Feature(
        "DRAPartitionableDevices",
        "dynamic MIG (--mig-mode dynamic): MIG partitions offered through shared counters",
    ),
    Feature(
        "DRADeviceTaints",
        "health taints on unhealthy GPUs (and eviction with --health-taint-effect NoExecute)",
    ),
    Feature("DRAConsumableCapacity", "shares of a GPU by memory (--consumable-capacity)"),
    Feature(
        "DRAExtendedResource", "pods asking nvidia.com/gpu (the chart's extendedResourceClass)"
    ),
    Feature(
        "DRADeviceBindingConditions", "ComputeDomains' IMEX daemon started before the pod is bound"
    ),
    Feature(
        "ResourceHealthStatus",
        "a GPU's health in the pod's status (allocatedResourcesStatus)",
        components="kube-apiserver, kubelet",
    ),
)


@dataclass(frozen=True)
class Line:
    """One minor release line of Kubernetes and what it does differently for a driver."""

    minor: int
    release: str  # the patch release tested here (tools/controlplane); "" for a newer line
    max_devices = 128  # devices a slice may hold (ResourceSliceMaxDevices), on every line

    @property
    def name(self) -> str:
        return f"1.{self.minor}"

    # -- ResourceSlices --------------------------------------------------------------
    @property
    def counters_apart(self) -> bool:
        """From 1.35 a slice holds devices or counter sets, never both ("only one of
        `sharedCounters` or `devices` is allowed", no gate, no ratcheting), and devices
        consume counter sets of another slice of their pool. In 1.34 a device may consume
        only counter sets of its own slice."""
        return self.minor >= 35

    @property
    def max_devices_counted_or_tainted(self) -> int:
        """From 1.35: 64 where any device of the slice has taints or consumes counters
        (ResourceSliceMaxDevicesWithTaintsOrConsumesCounters)."""
        return 64 if self.minor >= 35 else 128

    @property
    def max_counter_sets(self) -> int | None:
        """From 1.35: 8 counter sets a slice (ResourceSliceMaxCounterSets), 32 counters
        each; 1.34 counts counters, not sets (32 a slice, ResourceSliceMaxSharedCounters)."""
        return 8 if self.minor >= 35 else None

    # From 1.36 the allocator tries a pool's slices in name order, then each slice's
    # devices in order (structured/internal/incubating pools_incubating.go,
    # sortSlicesByName); before, slices come in the informer's (map) order and only the
    # order within a slice holds. Nothing reads it: slices.build lays slices out for both
    # (zero-padded keys for the name order).

    # -- authorization -----------------------------------------------------------------
    @property
    def claim_status_per_driver(self) -> bool:
        """From 1.36 (DRAResourceClaimGranularStatusAuthorization, beta, on): writing a
        claim's status.devices also needs `resourceclaims/driver` named after the driver,
        verb `associated-node:patch` (a ServiceAccount token bound to the claim's node)
        or `arbitrary-node:patch`."""
        return self.minor >= 36

    # -- features ----------------------------------------------------------------------
    def on_by_default(self, feature: Feature) -> bool:
        return self.minor >= feature.on_by_default_from

    def gates_to_turn_on(self) -> tuple[str, ...]:
        """What a cluster of this line turns on for every feature the driver has."""
        return tuple(f.gate for f in FEATURES if not self.on_by_default(f))


LINES: tuple[Line, ...] = (
    Line(34, "v1.34.4"),
    Line(35, "v1.35.4"),
    Line(36, "v1.36.3"),
    Line(37, "v1.37.2"),
)
OLDEST, NEWEST = LINES[0], LINES[-1]
_VERSION = re.compile(r"v?1\.(\d+)(?:\.\d+)?(?:[-+].*)?")


def parse_version(text: str) -> int:
    """The minor of "1.37", "v1.37.2" or a vendor's "v1.36.3-eks-1234abc"."""
    m = _VERSION.fullmatch(text.strip())
    if not m:
        raise LineError(f"{text!r} is not a Kubernetes version (1.MINOR[.PATCH])")
    return int(m.group(1))


def line(version: str | int) -> Line:
    """The line of a version. A version older than the oldest line is refused; one newer
    than the newest behaves as the newest (its release unknown here): newer lines have
    so far kept what the ones before them allowed."""
    minor = version if isinstance(version, int) else parse_version(version)
    if minor < OLDEST.minor:
        raise LineError(
            f"Kubernetes 1.{minor} is older than this driver supports "
            f"({OLDEST.name} to {NEWEST.name}): DRA's resource.k8s.io/v1 is GA from 1.34"
        )
    return next((ln for ln in LINES if ln.minor == minor), Line(minor, ""))

"""The quota classes of what the fleet publishes: the chart's quotaClasses values (a
DeviceClass per product and per MIG profile), the DeviceClass names the chart makes of
them, and Kueue's mapping of each as a quota resource. Its own file: configuration
written from what the fleet publishes (`dradriver fleet --quota-classes` and `--kueue`),
not a judgement of it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from dradriver.diagnose.fleet import DRIVER, attr, kind_of
from dradriver.diagnose.world import World


def class_name(product: str) -> str:
    """A DNS label for a product's class: "NVIDIA H100 80GB HBM3" -> "h100-80gb-hbm3"."""
    words = product.lower().removeprefix("nvidia").strip()
    label = "".join(c if c.isalnum() else "-" for c in words)
    while "--" in label:
        label = label.replace("--", "-")
    return label.strip("-")[:63].strip("-") or "gpu"


def quota_classes(w: World) -> dict[str, list[dict[str, str]]]:
    """The chart's quotaClasses values for what the fleet publishes: a class per product
    of whole GPUs and per MIG profile (of one product each where two products share a
    profile name, so that a quota never counts an A100's 1g.10gb as an H100's)."""
    products: set[str] = set()
    profiles: dict[str, set[str]] = defaultdict(set)
    for d in w.devices:
        if d.driver != DRIVER:
            continue
        if kind_of(d) == "gpu" and d.product():
            products.add(d.product())
        elif kind_of(d) == "mig" and attr(d, "profile"):
            profiles[attr(d, "profile")].add(d.product())
    migs: list[dict[str, str]] = []
    for profile, owners in sorted(profiles.items()):
        short = profile.replace(".", "").replace("+", "-")
        if len(owners) == 1:
            migs.append({"profile": profile})
            continue
        for p in sorted(owners):
            migs.append(
                {
                    "name": f"{short}-{class_name(p)}"[:63].strip("-"),
                    "profile": profile,
                    "productName": p,
                }
            )
    return {
        "products": [{"name": class_name(p), "productName": p} for p in sorted(products)],
        "migProfiles": migs,
    }


def quota_class_names(
    values: Mapping[str, list[dict[str, str]]],
    gpu_class: str = "gpu.dradriver.io",
    mig_class: str = "mig.dradriver.io",
) -> list[str]:
    """The DeviceClasses the chart makes of quotaClasses values (templates/
    deviceclasses.yaml): <name>.<gpu class> per product; <name, else the profile without
    dots, '+' as '-'>.<mig class> per MIG profile."""
    out = [f"{p['name']}.{gpu_class}" for p in values.get("products") or []]
    for m in values.get("migProfiles") or []:
        name = m.get("name") or m["profile"].replace(".", "").replace("+", "-")
        out.append(f"{name}.{mig_class}")
    return out


def kueue_mappings(classes: Sequence[str]) -> dict[str, Any]:
    """Kueue's `resources` configuration (its DynamicResourceAllocation gate): each class
    charged as a quota resource of its own name, what a ClusterQueue then lists in its
    coveredResources."""
    return {
        "resources": {
            "deviceClassMappings": [{"name": c, "deviceClassNames": [c]} for c in classes]
        }
    }

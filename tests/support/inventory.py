"""Inventories discovered through the real discovery code over the fake NVML library."""

from __future__ import annotations

from functools import cache

from dradriver.inventory.model import Inventory
from dradriver.nvml.library import open_nvml


@cache
def inventory(spec: str, node: str = "node-a") -> Inventory:
    """Discovered through the real discovery code over the fake NVML library."""
    return open_nvml(f"fake:{spec}", node=node, state_dir=None).discover().inventory

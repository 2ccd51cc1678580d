"""The GPU inventory: what a node has, as plain values (no I/O)."""

from dradriver.inventory.model import Gpu, Inventory, MigDevice, MigProfile

__all__ = ["Gpu", "Inventory", "MigDevice", "MigProfile"]

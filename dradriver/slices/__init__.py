"""Inventory -> ResourceSlices: what the node publishes, and keeping it published."""

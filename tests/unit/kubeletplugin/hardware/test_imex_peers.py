"""The IMEX peers a node reads from its ComputeDomain's status become lines of the
daemon's nodes_config: only IP addresses may, whoever wrote the status."""

from __future__ import annotations

from typing import Any

import pytest

from dradriver.kubeletplugin.hardware.imex import peers_of


def domain(*addresses: str) -> dict[str, Any]:
    nodes = [{"name": f"n{i}", "address": a} for i, a in enumerate(addresses)]
    return {"spec": {"numNodes": len(nodes)}, "status": {"nodes": nodes}}


def test_the_peers_are_the_domains_addresses() -> None:
    assert peers_of(domain("10.0.0.2", "fd00::1"), "n0", "uid") == (
        "10.0.0.2",
        ("10.0.0.2", "fd00::1"),
    )


@pytest.mark.parametrize(
    "bad", ["10.0.0.3\n10.6.6.6", "10.0.0.3 # x", "node-b.example", "fe80::1%eth0\nx", ""]
)
def test_an_address_that_is_not_an_ip_never_reaches_the_config(bad: str) -> None:
    said = peers_of(domain("10.0.0.2", bad), "n0", "uid")
    assert isinstance(said, str), said
    assert "n1" in said and ("not an IP address" in said or "no IMEX address" in said)

"""A node's IMEX address goes, a line each, into every peer's IMEX nodes_config: from
its label or its InternalIP, only an IP address gets there."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from dradriver.api import computedomain as cd
from dradriver.controller.computedomain.controller import node_address


def node(*internal: Any, label: str | None = None) -> dict[str, Any]:
    addresses = [{"type": "Hostname", "address": "n1"}]
    addresses += [{"type": "InternalIP", "address": a} for a in internal]
    meta: dict[str, Any] = {"name": "n1"}
    if label is not None:
        meta["labels"] = {cd.IMEX_ADDRESS_LABEL: label}
    return {"metadata": meta, "status": {"addresses": addresses}}


@pytest.mark.parametrize(
    "bad",
    [
        "10.0.0.1\n10.6.6.6",  # a second line: a peer nobody chose
        "10.0.0.1\n",
        "not-an-address",
        "",
        "fe80::1%eth0\n10.6.6.6",  # ipaddress takes any text after an IPv6 zone's %
        "fe80::1%eth0",
        None,
        ["10.0.0.1"],
    ],
)
def test_an_internal_ip_that_is_not_an_ip_address_is_skipped_and_logged(
    bad: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="controller.computedomain"):
        assert node_address(node(bad)) is None
    assert [r.getMessage() for r in caplog.records] == [
        "ignoring a node's InternalIP: not an IP address"
    ]
    assert getattr(caplog.records[0], "fields", {})["node"] == "n1"


def test_the_first_internal_ip_that_is_an_address_is_taken() -> None:
    assert node_address(node("junk\n", "10.0.0.2", "10.0.0.3")) == "10.0.0.2"
    assert node_address(node("fd00::2")) == "fd00::2"


def test_a_bad_label_falls_back_to_the_internal_ip_and_a_bad_one_of_both_to_none() -> None:
    assert node_address(node("10.0.0.1", label="fe80::1%eth0")) == "10.0.0.1"
    assert node_address(node("10.0.0.1\nx", label="bad")) is None

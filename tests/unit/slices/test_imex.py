"""IMEX channel devices: published where all of the node's GPUs are in one fabric clique
on a driver that has channels, as the ComputeDomain controller reads them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from dradriver.api import computedomain as cd
from dradriver.controller.computedomain.placement import node_cliques
from dradriver.slices.build import check_limits
from dradriver.slices.imex import channel_slice, node_clique
from tests.support.inventory import inventory

DATA = Path(__file__).resolve().parents[2] / "data"


def test_a_gb200_tray_publishes_its_channel_device_in_its_clique() -> None:
    inv = inventory(f"@{DATA / 'gb200-clique-1.yaml'}")
    clique = node_clique(inv)
    assert clique is not None and clique.endswith(".1")
    channels, why = channel_slice(inv)
    assert channels is not None and why == ""
    check_limits([channels])
    # One device a node: a node is in one IMEX domain at a time.
    assert channels.devices == (
        {
            "name": cd.CHANNEL_DEVICE,
            "attributes": {"type": {"string": "imex-channel"}, "nvlinkDomain": {"string": clique}},
        },
    )
    # What the controller places domains by: the same clique, read back from the slice.
    body = {"spec": {"driver": "d", "nodeName": "n", "devices": list(channels.devices)}}
    assert node_cliques([body], "d") == {"n": clique}
    # Where the API server keeps binding conditions, the scheduler holds the pod until
    # the node says its IMEX daemon is ready (or gives the node up when it cannot be).
    held, _ = channel_slice(inv, binding=True)
    assert held is not None
    (device,) = held.devices
    assert device["bindingConditions"] == ["IMEXDaemonReady"]
    assert device["bindingFailureConditions"] == ["IMEXDaemonFailed"]
    check_limits([held])


def test_two_trays_of_a_rack_share_the_cluster_but_not_the_clique() -> None:
    a = node_clique(inventory(f"@{DATA / 'gb200-clique-1.yaml'}", node="a"))
    b = node_clique(inventory(f"@{DATA / 'gb200-clique-2.yaml'}", node="b"))
    a2 = node_clique(inventory(f"@{DATA / 'gb200-clique-1.yaml'}", node="a2"))
    assert a == a2 and a != b
    assert a is not None and b is not None and a.split(".")[0] == b.split(".")[0]


def test_no_channels_without_one_clique_or_before_the_driver_has_them() -> None:
    channels, why = channel_slice(inventory("8xH100-80GB"))
    assert channels is None and "not all in one multi-node NVLink fabric clique" in why
    old = inventory("4xGB200")  # the fake's default driver, 570.86.15
    channels, why = channel_slice(old)
    assert channels is None and "570.86.15 is older than 570.158.1" in why
    tray = inventory(f"@{DATA / 'gb200-clique-1.yaml'}")
    split = replace(tray, gpus=(tray.gpus[0], replace(tray.gpus[1], nvlink_domain="x.2")))
    assert node_clique(split) is None

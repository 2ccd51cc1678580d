"""What the device view publishes of shares (consumable capacity) by the node's driver: a
driver before r615 (MPS v2) cannot isolate shares from one another, so they are offered
only where --mps-v2-shares allow says so."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from dradriver.inventory.node_devices import MigMode
from dradriver.kubeletplugin.device_view.view import DeviceView
from dradriver.nvml.library import open_nvml
from dradriver.slices.consumable import from_flags


def shared(slices: list[Any]) -> list[str]:
    return [d["name"] for s in slices for d in s.devices if d.get("allowMultipleAllocations")]


def view(tmp_path: Path, spec: str, *, allow: bool) -> DeviceView:
    nvml = open_nvml(spec, node="n1", state_dir=tmp_path)
    nvml.init()
    return DeviceView(
        nvml, MigMode.NONE, consumable=from_flags("memory", "none"), mps_v2_shares=allow
    )


def test_shares_on_mps_v2_only_where_allowed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        refused = view(tmp_path / "a", "fake:2xH100-80GB", allow=False)
        assert shared(refused.refresh()) == []
        refused.refresh()  # said once per driver
        said = [r.getMessage() for r in caplog.records if "no shares" in r.getMessage()]
        assert len(said) == 1 and "--mps-v2-shares allow" in said[0]
        allowed = view(tmp_path / "b", "fake:2xH100-80GB", allow=True)
        assert len(shared(allowed.refresh())) == 2
    # r615+ (MPS v3, a server and namespace per share): shared whatever the flag says.
    v3 = view(tmp_path / "c", "fake:driver=615.2.1;2xH100-80GB", allow=False)
    assert len(shared(v3.refresh())) == 2

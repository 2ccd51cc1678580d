"""CDI names and paths are made of the claim's UID, the driver's and the devices' names:
a trailing newline in any of them is refused, as anything else outside their rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dradriver.kubeletplugin.prepare.cdi import CdiDevice, CdiWriter, claim_spec

DRIVER = "gpu.dradriver.io"
UID = "0f3c9a52-7b1d-4c8e-9a6f-2d4b8c1e5f70"
GPU0 = "GPU-11111111-1111-1111-1111-111111111111"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"claim_uid": UID + "\n"}, "not a Kubernetes UID"),
        ({"driver": DRIVER + "\n"}, "driver name"),
        ({"devices": [CdiDevice("gpu-0\n", GPU0)]}, "device name"),
    ],
)
def test_a_spec_with_a_trailing_newline_in_a_name_is_refused(
    kwargs: dict[str, Any], match: str
) -> None:
    args: dict[str, Any] = {
        "driver": DRIVER,
        "claim_uid": UID,
        "devices": [CdiDevice("gpu-0", GPU0)],
        "claim_name": "team/train",
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        claim_spec(**args)


def test_a_spec_path_for_a_uid_with_a_trailing_newline_is_refused(tmp_path: Path) -> None:
    writer = CdiWriter(tmp_path, DRIVER)
    with pytest.raises(ValueError, match="not a Kubernetes UID"):
        writer.spec_path(UID + "\n")
    with pytest.raises(ValueError, match="driver name"):
        CdiWriter(tmp_path, DRIVER + "\n")


def test_a_spec_file_named_with_a_newline_is_not_taken_for_a_claim(tmp_path: Path) -> None:
    (tmp_path / f"{DRIVER}-claim-{UID}\n.json").write_text("{}")
    assert CdiWriter(tmp_path, DRIVER).list_claims() == []

"""`dradriver devices` as a newcomer reads it: the GPUs, the MIG profile names a claim
selects by (with what each instance gets, in human units), and the slices."""

from __future__ import annotations

import pytest

from dradriver.cli import main


def test_the_table_lists_each_products_mig_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--devices", "fake:2xH100-80GB+1xL4"]) == 0
    out = capsys.readouterr().out
    # Once per product, not per GPU; none for the L4, which has no MIG.
    assert out.count("MIG profiles of NVIDIA H100 80GB HBM3 (GPU 0 and alike):") == 1
    assert "MIG profiles of NVIDIA L4" not in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("  ")}
    assert rows["1g.10gb"][1:3] == ["9.8", "GiB"]
    assert rows["1g.10gb+me"][-3:] == ["1", "0,1,2,3,4,5,6", "1"]  # the one OFA; once per GPU
    assert rows["3g.40gb"][-2:] == ["0,4", "2"]
    assert rows["7g.80gb"][3] == "132"  # SMs

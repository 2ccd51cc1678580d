"""`pip install .` (and the image built from it) carries the product only: no local
control plane, hollow node launcher, demo or test bench."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_the_product_and_nothing_else(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(tmp_path), str(REPO)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("dradriver-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"dradriver"}
    modules = {Path(n).stem for n in names if n.endswith(".py")}
    for bench in ("cluster", "demo", "kubeletsim", "hollow_node", "standin"):
        assert bench not in modules, bench
    assert "dradriver/kubeletplugin/main.py" in names
    assert "dradriver/controller/main.py" in names

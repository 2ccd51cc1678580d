"""`pip install .` (and the image built from it) carries the product only: the driver and
the fake NVML backend of `--devices fake:...`; no local control plane, hollow node
launcher, demo or test bench. And the driver reaches the fake only through the backend
choice."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.support.pyimports import module_imports

REPO = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_the_product_and_nothing_else(tmp_path: Path) -> None:
    # A copy: setuptools' build/ in the checkout keeps files that no longer exist.
    src = tmp_path / "src"
    shutil.copytree(
        REPO,
        src,
        ignore=shutil.ignore_patterns(".venv", ".git", "build", ".devcluster", "*_cache"),
    )
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*cmd, "-w", str(tmp_path), str(src)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("dradriver-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"dradriver", "fakenvml"}
    modules = {Path(n).stem for n in names if n.endswith(".py")}
    for bench in ("cluster", "demo", "kubeletsim", "hollow_node", "standin"):
        assert bench not in modules, bench
    assert "dradriver/kubeletplugin/prepare/preparer.py" in names
    assert "dradriver/controller/main.py" in names


def test_the_driver_reaches_the_fake_only_through_the_backend_choice() -> None:
    importers = {
        str(p.relative_to(REPO))
        for p in (REPO / "dradriver").rglob("*.py")
        if any(m == "fakenvml" or m.startswith("fakenvml.") for m in module_imports(p))
    }
    assert importers == {"dradriver/nvml/library.py"}
    # And no code of the driver asks whether it runs on fake GPUs.
    for p in (REPO / "dradriver").rglob("*.py"):
        if "/gen/" in str(p):
            continue
        names = {n.attr for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Attribute)}
        names |= {n.arg for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.arg)}
        assert "fake" not in names, p


def test_the_image_copies_what_the_wheel_packages() -> None:
    """The image's inputs match the wheel's packages (tests/kind builds and runs it; this
    is the check that needs no Docker). The ignore file is the root one, which the classic
    builder reads too."""
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    ignore = (REPO / ".dockerignore").read_text().split()
    for package in ("dradriver", "fakenvml"):
        assert f"COPY {package} /src/{package}" in dockerfile
        assert f"!{package}/" in ignore
    assert "devtools" not in dockerfile and "!devtools/" not in ignore

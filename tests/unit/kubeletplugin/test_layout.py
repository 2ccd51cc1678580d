"""The node component's packages keep to what their docstrings say they may import, so
the tree goes on showing the design (dradriver/kubeletplugin/__init__.py)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.pyimports import module_imports

PLUGIN = Path(__file__).resolve().parents[3] / "dradriver" / "kubeletplugin"
PACKAGES = (
    "grpc_edge", "prepare", "state", "daemons", "hardware", "device_view", "endpoints",
    "imex_binding",
)  # fmt: skip
# What each package may import of the plugin's other packages.
ALLOWED = {
    "grpc_edge": {"state"},  # the records only: a ClaimRef (stdlib imports alone)
    "state": set(),
    "daemons": {"state"},
    "hardware": {"state", "daemons"},
    "device_view": set(),
    "endpoints": set(),
    "prepare": {"state", "hardware", "endpoints", "daemons"},
    "imex_binding": {"prepare", "state", "hardware", "daemons"},
}
# Off the registration path: the gRPC edge binds the sockets before any of these loads.
HEAVY = ("dradriver.k8s", "dradriver.nvml", "dradriver.slices", "kubernetes", "pynvml", "fakenvml")


def test_each_package_imports_only_what_it_may() -> None:
    for pkg in PACKAGES:
        for path in (PLUGIN / pkg).rglob("*.py"):
            used = {
                m.split(".")[2]
                for m in module_imports(path)
                if m.startswith("dradriver.kubeletplugin.") and m.split(".")[2] in PACKAGES
            }
            assert used - {pkg} <= ALLOWED[pkg], f"{path.relative_to(PLUGIN)}: {used}"


def test_the_grpc_edge_imports_nothing_heavy() -> None:
    for path in (PLUGIN / "grpc_edge").rglob("*.py"):
        heavy = {m for m in module_imports(path) if m.startswith(HEAVY)}
        assert not heavy, f"{path.name}: {heavy}"


def test_every_package_says_what_it_holds_and_no_module_is_large() -> None:
    for pkg in (PLUGIN, *(PLUGIN / p for p in PACKAGES), PLUGIN / "state" / "checkpoint"):
        doc = ast.get_docstring(ast.parse((pkg / "__init__.py").read_text()))
        assert doc and len(doc) > 80, pkg
    for path in PLUGIN.rglob("*.py"):
        assert len(path.read_text().splitlines()) <= 400, path.relative_to(PLUGIN)
    assert sorted(p.name for p in PLUGIN.glob("*.py")) == [
        "__init__.py",
        "main.py",
        "options.py",
        "startup.py",
        "uninstall.py",
    ]

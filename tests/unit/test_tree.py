"""tests/unit mirrors the code: a module's tests are found from its path. The tests of
dradriver/kubeletplugin/prepare/plan.py are tests/unit/kubeletplugin/prepare/test_plan.py,
or test_plan_<aspect>.py beside it; fakenvml's and the developer tools' under their own
names. Shared fixtures live in tests/support, never in another test module."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "tests" / "unit"
# Where each top-level folder of tests/unit finds its code.
CODE = {"fakenvml": ROOT / "fakenvml", "devtools": ROOT / "devtools" / "dradriver_dev"}
# Checks of a tree as a whole, named for what they check.
WHOLE = {
    "test_docs.py",
    "test_package_graph.py",
    "test_packaging.py",
    "test_style.py",
    "test_tests.py",
    "test_tree.py",
    "test_walk.py",
}
WHOLE_IN = {"kubeletplugin/test_layout.py"}


def code_of(test: Path) -> Path:
    rel = test.relative_to(UNIT).parent
    top = rel.parts[0] if rel.parts else ""
    if top in CODE:
        return CODE[top].joinpath(*rel.parts[1:])
    return ROOT / "dradriver" / rel


def test_every_test_module_is_named_for_a_module_of_its_folder() -> None:
    lost = []
    for test in sorted(UNIT.rglob("test_*.py")):
        rel = str(test.relative_to(UNIT))
        if rel in WHOLE or rel in WHOLE_IN:
            continue
        folder = code_of(test)
        names = {p.stem for p in folder.glob("*.py")} | {p.name for p in folder.glob("*/")}
        subject = test.stem.removeprefix("test_")
        if not any(subject == n or subject.startswith(n + "_") for n in names - {"__init__"}):
            lost.append(rel)
    assert lost == [], f"test modules named for no module of {', '.join(lost)}"


def test_no_test_module_imports_another() -> None:
    for test in sorted(UNIT.rglob("*.py")):
        tree = ast.parse(test.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                target = node.module if node.level == 0 else f"(relative) {node.module}"
                assert not (node.module.startswith("tests.unit") or node.level), (
                    f"{test.relative_to(ROOT)} imports {target}: shared code goes to tests/support"
                )

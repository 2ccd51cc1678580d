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
    "test_budget.py",
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


def test_every_module_of_the_node_and_the_api_client_has_its_tests_found() -> None:
    """Each module of dradriver/kubeletplugin/ and dradriver/k8s/ has a test named for it,
    or a line in tests/README.md ("Modules tested under another name") naming tests that
    exist (issue Q21)."""
    readme = (ROOT / "tests" / "README.md").read_text()
    section = readme.split("## Modules tested under another name", 1)[1].split("\n## ", 1)[0]
    listed: dict[str, list[str]] = {}
    for line in section.splitlines():
        if line.startswith("- `"):
            module, _, tests = line[3:].partition("`: ")
            listed[module] = [t.split(" ")[0] for t in tests.split(", ")]
    missing, stale = [], []
    for pkg in ("kubeletplugin", "k8s"):
        for path in sorted((ROOT / "dradriver" / pkg).rglob("*.py")):
            if path.name == "__init__.py" or "gen" in path.parts:
                continue
            rel = path.relative_to(ROOT / "dradriver")
            folder = UNIT / rel.parent
            named = [*folder.glob(f"test_{path.stem}.py"), *folder.glob(f"test_{path.stem}_*.py")]
            if named:
                continue
            tests = listed.get(str(rel))
            if not tests:
                missing.append(str(rel))
            stale += [t for t in tests or [] if not (ROOT / t).exists()]
    assert missing == [], f"no test named for, nor listed in tests/README.md: {missing}"
    assert stale == [], f"tests/README.md names tests that do not exist: {stale}"
    assert set(listed) <= {
        str(p.relative_to(ROOT / "dradriver"))
        for pkg in ("kubeletplugin", "k8s")
        for p in (ROOT / "dradriver" / pkg).rglob("*.py")
    }, "tests/README.md lists a module that is gone"

"""House rules a reader relies on, checked over all of dradriver/: a function with more
than three parameters takes the rest by keyword, so a call says what each value is; and
no module is longer than a reader holds in mind at once (MAX_LINES)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "dradriver"
# Positional by design, each with the reason.
POSITIONAL = {
    # A REST path's parts, in the URL's order: path_for(api_version, plural, ns, name).
    "k8s/client.py:path_for",
    # Rows of a table of CEL overloads, one line each.
    "diagnose/cel.py:_overload",
}

MAX_LINES = 400


def test_past_three_parameters_they_are_keywords() -> None:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if "gen" in path.relative_to(ROOT).parts:
            continue  # generated from api/*.proto
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            names = [a.arg for a in node.args.posonlyargs + node.args.args]
            if names and names[0] in ("self", "cls"):
                names = names[1:]
            where = f"{path.relative_to(ROOT)}:{node.name}"
            if len(names) > 3 and node.args.vararg is None and where not in POSITIONAL:
                found.append(f"{where}({', '.join(names)})")
    assert found == [], "put `*` after the third parameter: " + "; ".join(found)


def test_no_module_is_over_max_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in sorted(ROOT.rglob("*.py"))
        if "gen" not in path.relative_to(ROOT).parts
        and (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"split by purpose, each under {MAX_LINES} lines: {long}"

"""The code budget (issue Q21, item 9): the node component and the API client, counted in
code lines (no blanks, comments or docstrings) per capability, from the table in
docs/development.md ("Where the node's lines go"). Every module belongs to exactly one
row; a row past its budget fails, and so does the whole past the total the section
states. A new capability adds its own row; a budget raised needs its reason in the doc.
The counts are printed (`pytest -s tests/unit/test_budget.py`)."""

from __future__ import annotations

import ast
import fnmatch
import io
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("kubeletplugin", "k8s")
DOC = REPO / "docs" / "development.md"
SECTION = "## Where the node's lines go"
TARGET = 7_000  # issue Q21's goal for kubeletplugin/ + k8s/


def code_lines(source: str) -> int:
    """Lines holding code: not blank, not only a comment, not part of a docstring."""
    docs: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = body[0] if body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docs.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in skip and tok.type != tokenize.ENDMARKER:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines - docs)


def table() -> tuple[list[tuple[str, list[str], int]], int]:
    """(capability, module patterns, budget) per row, and the total budget."""
    text = DOC.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.find("\n## ", len(SECTION))]
    total = re.search(r"at most ([\d,]+)\s+code\s+lines\s+in\s+all", section)
    assert total, f"{DOC.name}: the section states no total ('at most N code lines in all')"
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[2].replace(",", "").isdigit():
            continue
        patterns = re.findall(r"`([^`]+)`", cells[1])
        rows.append((cells[0], patterns, int(cells[2].replace(",", ""))))
    return rows, int(total.group(1).replace(",", ""))


def modules() -> dict[str, int]:
    base = REPO / "dradriver"
    return {
        str(p.relative_to(base)): code_lines(p.read_text())
        for root in ROOTS
        for p in sorted((base / root).rglob("*.py"))
    }


def test_every_module_is_in_one_row_and_every_row_within_its_budget() -> None:
    rows, total = table()
    assert rows, "no rows parsed"
    counts = modules()
    owner: dict[str, list[str]] = {m: [] for m in counts}
    for capability, patterns, _ in rows:
        for m in counts:
            if any(fnmatch.fnmatchcase(m, p) for p in patterns):
                owner[m].append(capability)
    assert [m for m, o in owner.items() if not o] == [], "modules in no row"
    assert {m: o for m, o in owner.items() if len(o) > 1} == {}, "modules in two rows"
    over = []
    for capability, _, budget in rows:
        used = sum(n for m, n in counts.items() if owner[m] == [capability])
        print(f"{used:6,} / {budget:6,}  {capability}")
        if used > budget:
            over.append((capability, used, budget))
    whole = sum(counts.values())
    print(f"{whole:6,} / {total:6,}  in all (Q21's target {TARGET:,})")
    assert over == [], "rows past their budget"
    assert whole <= total
    assert sum(b for _, _, b in rows) >= whole  # the rows add up to what is there


def test_the_counter_skips_blanks_comments_and_docstrings() -> None:
    source = (
        '"""Doc\nstring."""\n\n# a comment\nx = 1  # why\n\n\n'
        'def f() -> None:\n    """One."""\n    return None\n'
    )
    assert code_lines(source) == 3

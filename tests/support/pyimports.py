"""What a Python file imports, read from its syntax tree (for the tests that check who
may import what)."""

from __future__ import annotations

import ast
from pathlib import Path


def module_imports(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (inside functions too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out

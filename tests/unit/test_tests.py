"""The tests hold what they claim, checked over every module under tests/: each test
checks something, none is skipped whatever the machine, and every example a user is
pointed at (examples/) runs in an end-to-end test.

What counts as checking, in a test (a function whose name starts with `test`, as pytest
collects them, in a test_*.py module or a class of one): an `assert`; `pytest.raises`,
`pytest.warns` or `pytest.fail`; or a call to a helper whose name says it checks
(assert, check, expect, verify, wait_for or wait_until, alone or before a `_`) when
every function of that name it may be (its own module's, else every one in tests/ and
in the code: dradriver/, fakenvml/, devtools/) checks in turn: an `assert`, a `raise`,
one of those pytest calls, or such a helper. So `check_ref(good)` is a test that the
code's own check lets a good value through, and `out.check()` one that fails on what
was collected. A function nested in a test counts only where the test names it. A
`raise` in the test itself does not count: a test says what it expects with assert or
pytest.fail.

An unconditional skip: `pytest.mark.skip` anywhere in a test module (a decorator,
`pytestmark`, a `pytest.param`'s marks), `pytest.mark.skipif` of a constant true
condition, and `pytest.skip()` in a test or a fixture, or at a module's top level, that
no `if`, loop, `match`, `except`, conditional expression or `and`/`or` guards. A skip
under a condition (a Kubernetes line, a missing tool, root) is the machine's answer.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
CODE = [ROOT / "dradriver", ROOT / "fakenvml", ROOT / "devtools" / "dradriver_dev"]
EXAMPLES = ROOT / "examples"
E2E = TESTS / "e2e"

CHECKING = re.compile(r"^_?(assert|check|expect|verify|wait_for|wait_until)(_|$)")
PYTEST_CHECKS = {"raises", "warns", "fail"}
# What makes the statements under it conditional.
GUARDS = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Match, ast.IfExp, ast.BoolOp)

Function = ast.FunctionDef | ast.AsyncFunctionDef
Modules = Mapping[str, ast.Module]  # path under the repository -> its tree


def parse_all(*folders: Path) -> dict[str, ast.Module]:
    return {
        str(p.relative_to(ROOT)): ast.parse(p.read_text(), filename=str(p))
        for folder in folders
        for p in sorted(folder.rglob("*.py"))
    }


def is_test_module(path: str) -> bool:
    return Path(path).name.startswith("test_")


def is_pytest_attr(node: ast.AST, names: set[str]) -> bool:
    """`pytest.<name>` for a name in `names`."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr in names
        and isinstance(node.value, ast.Name)
        and node.value.id == "pytest"
    )


def is_mark(node: ast.AST, mark: str) -> bool:
    """`pytest.mark.<mark>`."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == mark
        and isinstance(node.value, ast.Attribute)
        and is_pytest_attr(node.value, {"mark"})
    )


def called_name(call: ast.Call) -> str:
    f = call.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return ""


def reached(fn: Function) -> Iterator[ast.AST]:
    """Every node of `fn`'s body, and of the functions nested in it that it names."""
    named = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
    stack: list[ast.AST] = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if node.name in named:
                stack.extend(node.body)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def collected(tree: ast.Module) -> Iterator[Function]:
    """The functions pytest collects as tests: module level, or in a class."""
    for node in tree.body:
        inner = node.body if isinstance(node, ast.ClassDef) else [node]
        for fn in inner:
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and fn.name.startswith(
                "test"
            ):
                yield fn


@dataclass
class Checks:
    """Which functions of a set of modules check something."""

    modules: Modules
    local: dict[str, dict[str, list[Function]]] = field(default_factory=dict)
    everywhere: dict[str, list[tuple[str, Function]]] = field(default_factory=dict)
    known: dict[int, bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for path, tree in self.modules.items():
            mine = self.local.setdefault(path, {})
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    mine.setdefault(node.name, []).append(node)
                    self.everywhere.setdefault(node.name, []).append((path, node))

    def helper(self, path: str, name: str) -> bool:
        """Whether a call of `name` from module `path` is a call to a helper that checks."""
        if not CHECKING.match(name):
            return False
        found = [(path, f) for f in self.local[path].get(name, [])]
        found = found or self.everywhere.get(name, [])
        return bool(found) and all(self._helper_checks(p, f) for p, f in found)

    def _helper_checks(self, path: str, fn: Function) -> bool:
        if id(fn) not in self.known:
            self.known[id(fn)] = False  # while it is looked at: calling itself checks nothing
            self.known[id(fn)] = self.checks(path, fn, helper=True)
        return self.known[id(fn)]

    def checks(self, path: str, fn: Function, *, helper: bool = False) -> bool:
        for node in reached(fn):
            if isinstance(node, ast.Assert) or (helper and isinstance(node, ast.Raise)):
                return True
            if isinstance(node, ast.Call) and (
                is_pytest_attr(node.func, PYTEST_CHECKS) or self.helper(path, called_name(node))
            ):
                return True
        return False


def checking_nothing(modules: Modules, code: Modules) -> list[str]:
    """The tests of `modules` that check nothing; their helpers may be in `code` too."""
    checks = Checks({**code, **modules})
    return [
        f"{path}:{fn.lineno} {fn.name}"
        for path, tree in modules.items()
        if is_test_module(path)
        for fn in collected(tree)
        if not checks.checks(path, fn)
    ]


def fixtures(tree: ast.Module) -> Iterator[Function]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
            is_pytest_attr(d.func if isinstance(d, ast.Call) else d, {"fixture"})
            for d in node.decorator_list
        ):
            yield node


def unguarded(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of `body` that run whenever it runs: into `with` and `try` (not
    its handlers), never under a guard."""
    for stmt in body:
        if isinstance(stmt, GUARDS):
            continue
        yield stmt
        if isinstance(stmt, ast.With | ast.AsyncWith):
            yield from unguarded(stmt.body)
        elif isinstance(stmt, ast.Try | ast.TryStar):
            for part in (stmt.body, stmt.orelse, stmt.finalbody):
                yield from unguarded(part)


def calls_skip(stmt: ast.stmt) -> bool:
    """Whether `stmt` itself calls pytest.skip, outside any conditional expression (the
    statements nested in it are `unguarded`'s to look at)."""
    stack: list[ast.AST] = [
        c for c in ast.iter_child_nodes(stmt) if not isinstance(c, ast.stmt | ast.excepthandler)
    ]
    while stack:
        node = stack.pop()
        if isinstance(node, (*GUARDS, ast.Lambda)):
            continue
        if isinstance(node, ast.Call) and is_pytest_attr(node.func, {"skip"}):
            return True
        stack.extend(ast.iter_child_nodes(node))
    return False


def unconditional_skips(modules: Modules) -> list[str]:
    found: list[tuple[str, int, str]] = []
    for path, tree in modules.items():
        bodies = [("the module", tree.body)]
        bodies += [(fn.name, fn.body) for fn in fixtures(tree)]
        if is_test_module(path):
            bodies += [(fn.name, fn.body) for fn in collected(tree)]
            for node in ast.walk(tree):
                if is_mark(node, "skip"):
                    found.append((path, node.lineno, "pytest.mark.skip"))
                if isinstance(node, ast.Call) and is_mark(node.func, "skipif"):
                    conds = node.args[:1] + [k.value for k in node.keywords if k.arg == "condition"]
                    for c in conds:
                        if isinstance(c, ast.Constant) and c.value:
                            found.append((path, node.lineno, f"pytest.mark.skipif({c.value!r})"))
        for name, body in bodies:
            for stmt in unguarded(body):
                if calls_skip(stmt):
                    found.append((path, stmt.lineno, f"pytest.skip() in {name}, unguarded"))
    return [f"{path}:{line} {what}" for path, line, what in sorted(found)]


def test_every_test_checks_something() -> None:
    empty = checking_nothing(parse_all(TESTS), parse_all(*CODE))
    assert empty == [], "tests that can fail only by crashing:\n" + "\n".join(empty)


def test_no_test_is_skipped_unconditionally() -> None:
    found = unconditional_skips(parse_all(TESTS))
    assert found == [], "skipped whatever the machine:\n" + "\n".join(found)


def parsed(folder: str, **sources: str) -> dict[str, ast.Module]:
    return {f"{folder}/{name}.py": ast.parse(textwrap.dedent(src)) for name, src in sources.items()}


def test_the_rules_flag_what_they_are_meant_to_and_nothing_else() -> None:
    """The two checks above pass over the suite as it is; here each rule, on purpose-made
    modules, flags the cases it is there for."""
    code = parsed(
        "dradriver",
        refs="""
        def check_ref(ref):
            if not ref:
                raise ValueError(ref)
        def check_nothing(ref):
            return ref
        """,
    )
    modules = parsed(
        "tests",
        helpers="""
        def wait_for(fn):
            raise AssertionError("timed out")
        def check_quietly(x):
            return x
        """,
        test_a="""
        import pytest
        from .helpers import check_quietly, wait_for
        def show(x):
            assert x
        def check_loud(x):
            assert x
        def test_nothing():
            x = 1
        def test_asserts():
            assert 1
        def test_raises():
            with pytest.raises(ValueError):
                int("x")
        def test_fails():
            pytest.fail("no")
        def test_a_checking_helper():
            check_loud(1)
        def test_an_imported_helper_that_raises():
            wait_for(lambda: 1)
        def test_a_helper_named_to_check_that_does_not():
            check_quietly(1)
        def test_a_helper_not_named_to_check():
            show(1)
        def test_a_nested_check_never_called():
            def inner():
                assert 1
        def test_a_nested_check_called():
            def inner():
                assert 1
            inner()
        def test_a_bare_raise():
            raise AssertionError("no")
        def test_the_codes_check_lets_a_good_value_through():
            check_ref("good")
        def test_a_codes_function_named_to_check_that_does_not():
            check_nothing("good")
        class TestGroup:
            def test_method(self):
                pass
        """,
    )
    assert [x.split(" ")[1] for x in checking_nothing(modules, code)] == [
        "test_nothing",
        "test_a_helper_named_to_check_that_does_not",
        "test_a_helper_not_named_to_check",
        "test_a_nested_check_never_called",
        "test_a_bare_raise",
        "test_a_codes_function_named_to_check_that_does_not",
        "test_method",
    ]
    skips = parsed(
        "tests",
        test_s="""
        import sys
        import pytest
        pytestmark = pytest.mark.skip(reason="module")
        @pytest.mark.skip
        def test_marked():
            assert 1
        @pytest.mark.skipif(True, reason="always")
        def test_skipif_true():
            assert 1
        @pytest.mark.skipif(sys.platform == "x", reason="fine")
        def test_skipif_cond():
            assert 1
        @pytest.mark.parametrize("x", [pytest.param(1, marks=pytest.mark.skip)])
        def test_param(x):
            assert x
        def test_skip_call():
            pytest.skip("always")
        def test_skip_in_with():
            with open("f"):
                pytest.skip("always")
        def test_skip_under_if():
            if sys.platform == "x":
                pytest.skip("fine")
            assert 1
        def test_skip_in_handler():
            try:
                import nothing
            except ImportError:
                pytest.skip("fine")
        def test_skip_in_bool():
            sys.platform == "x" and pytest.skip("fine")
        @pytest.fixture
        def fx():
            pytest.skip("always")
        """,
        conftest="""
        import pytest
        pytest.skip("whole module", allow_module_level=True)
        """,
    )
    assert unconditional_skips(skips) == [
        "tests/conftest.py:3 pytest.skip() in the module, unguarded",
        "tests/test_s.py:4 pytest.mark.skip",
        "tests/test_s.py:5 pytest.mark.skip",
        "tests/test_s.py:8 pytest.mark.skipif(True)",
        "tests/test_s.py:14 pytest.mark.skip",
        "tests/test_s.py:18 pytest.skip() in test_skip_call, unguarded",
        "tests/test_s.py:21 pytest.skip() in test_skip_in_with, unguarded",
        "tests/test_s.py:35 pytest.skip() in fx, unguarded",
    ]


def strings(tree: ast.Module) -> Iterator[str]:
    """The string constants of a module, its docstrings left out: a test names an
    example it runs in code, not in prose."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        is_string = isinstance(node, ast.Constant) and isinstance(node.value, str)
        if is_string and id(node) not in docstrings:
            yield node.value


def test_every_example_is_run_by_an_end_to_end_test() -> None:
    """docs/user-guide.md says each example is exercised by the end-to-end tests: each
    file under examples/ is named (as `<name>`, `<name>.yaml` or a path ending in it) in
    the code of a tests/e2e module."""
    examples = sorted(EXAMPLES.rglob("*.yaml"))
    assert examples
    stems = [p.stem for p in examples]
    # Named by their file name alone, so no two examples may share one.
    assert len(set(stems)) == len(stems), sorted(s for s in stems if stems.count(s) > 1)
    named: set[str] = set()
    for path in sorted(E2E.glob("*.py")):
        named |= set(strings(ast.parse(path.read_text())))
    missing = [
        str(p.relative_to(ROOT))
        for p in examples
        if not ({p.stem, p.name} & named or any(s.endswith(f"/{p.name}") for s in named))
    ]
    assert missing == [], "examples no end-to-end test runs: " + ", ".join(missing)

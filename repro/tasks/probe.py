"""Observe how a failing test misbehaves, the way a user filing an issue would: run the test's statements
one by one against the buggy code and report the first check that goes wrong ("`f(x)` returns 1.5, expected 2")."""

from __future__ import annotations

import ast
import importlib
import re
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_REPR = 160


@dataclass(frozen=True)
class Symptom:
    """The first wrong observation of a failing test: ``setup`` lines, then ``call`` which ``observed``
    (e.g. "returns `3`") where ``expected`` (e.g. "`2.5`") was due; ``imports``/``helpers`` make it runnable."""

    test_id: str
    call: str
    observed: str
    expected: str
    setup: tuple[str, ...] = ()
    imports: tuple[str, ...] = ()
    helpers: tuple[str, ...] = ()

    def sentence(self) -> str:
        tail = f", expected {self.expected}" if self.expected else ""
        return f"`{self.call}` {self.observed}{tail}."

    def assertion(self) -> str | None:
        """One line of Python that fails while the bug is there (``from m import f; assert f(1) == 2``), or None
        when the symptom needs setup or helpers, or what was expected is not a literal."""
        expected = self.expected.strip("`")
        if self.setup or self.helpers or len(self.imports) != 1 or "\n" in self.call or not expected:
            return None
        try:
            ast.literal_eval(expected)
        except (ValueError, SyntaxError):
            return None
        return f"{self.imports[0]}; assert {self.call} == {expected}"

    def snippet(self) -> str:
        """A reproduction in Python, ending in the misbehaving call and a comment on what it did."""
        note = self.observed + (f", expected {self.expected}" if self.expected else "")
        lines = [*self.imports, ""] if self.imports else []
        if self.helpers:
            lines += [*self.helpers, ""]
        *first, last = self.call.splitlines()
        lines += [*self.setup, *first, f"{last}  # {note.replace('`', '')}"]
        return "\n".join(lines)


def show(value: Any) -> str:
    """A short, machine-independent repr."""
    text = re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))
    return text if len(text) <= MAX_REPR else text[:MAX_REPR] + "..."


def show_error(exc: BaseException) -> str:
    message = str(exc)
    return f"{type(exc).__name__}: {show(message)[1:-1]}" if message else type(exc).__name__


@contextmanager
def isolated_imports(root: Path, packages: Iterable[str]) -> Iterator[None]:
    """Import ``packages`` from ``root`` for the block; afterwards the process's modules are as before."""
    names = set(packages)

    def owned(key: str) -> bool:
        return key.partition(".")[0] in names

    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if owned(k)}
    sys.path.insert(0, str(root))
    bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    importlib.invalidate_caches()
    try:
        yield
    finally:
        for key in [k for k in sys.modules if owned(k)]:
            del sys.modules[key]
        sys.modules.update(saved)
        sys.path.remove(str(root))
        sys.dont_write_bytecode = bytecode


class _Found(Exception):
    """Control flow: the first wrong observation."""

    def __init__(self, call: str, observed: str, expected: str = "") -> None:
        super().__init__(call)
        self.call, self.observed, self.expected = call, observed, expected


class _Runner:
    """Executes a test body statement by statement in ``ns``."""

    def __init__(self, source: str, ns: dict[str, Any]) -> None:
        self.source, self.ns = source, ns
        self.setup: list[str] = []

    def seg(self, node: ast.AST) -> str:
        return ast.get_source_segment(self.source, node) or ast.unparse(node)

    def eval(self, node: ast.expr) -> Any:
        try:
            return eval(compile(ast.Expression(node), "<probe>", "eval"), self.ns)
        except Exception as exc:
            raise _Found(self.seg(node), f"raises `{show_error(exc)}`") from exc

    def expected(self, node: ast.expr) -> Any:
        """The right-hand side's value, unwrapping ``pytest.approx(x)`` for display."""
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("approx") and node.args:
            return self.eval(node.args[0]), self.eval(node)
        value = self.eval(node)
        return value, value

    def check(self, stmt: ast.Assert) -> None:
        test = stmt.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq | ast.Is):
            shown, right = self.expected(test.comparators[0])
            left = self.eval(test.left)
            same = left is right if isinstance(test.ops[0], ast.Is) else left == right
            if not same:
                verb = "returns" if isinstance(test.left, ast.Call) else "is"
                raise _Found(self.seg(test.left), f"{verb} `{show(left)}`", f"`{show(shown)}`")
        elif not self.eval(test):
            detail = ""
            if isinstance(test, ast.Compare) and not isinstance(test.comparators[-1], ast.Constant):
                last = test.comparators[-1]
                detail = f" (`{self.seg(last)}` is `{show(self.eval(last))}`)"
            raise _Found(self.seg(test), f"is false{detail}")

    def raises(self, stmt: ast.With) -> None:
        expected = self.eval(stmt.items[0].context_expr.args[0])
        code = "\n".join(self.seg(s) for s in stmt.body)
        try:
            exec(compile(ast.Module(stmt.body, []), "<probe>", "exec"), self.ns)
        except expected:
            return
        except Exception as exc:
            raise _Found(code, f"raises `{show_error(exc)}`", f"`{expected.__name__}`") from exc
        raise _Found(code, f"does not raise `{expected.__name__}`")

    def run(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, ast.Assert):
                self.check(stmt)
            elif isinstance(stmt, ast.With) and _is_raises(stmt):
                self.raises(stmt)
            else:
                try:
                    exec(compile(ast.Module([stmt], []), "<probe>", "exec"), self.ns)
                except Exception as exc:
                    raise _Found(self.seg(stmt), f"raises `{show_error(exc)}`") from exc
                self.setup.append(self.seg(stmt))


def _is_raises(stmt: ast.With) -> bool:
    expr = stmt.items[0].context_expr
    return isinstance(expr, ast.Call) and ast.unparse(expr.func).endswith("raises") and bool(expr.args)


def _context(tree: ast.Module, source: str, used: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The test module's helper functions and imports that the reproduction ``used`` (and its helpers) needs."""
    words = set(re.findall(r"\w+", used))
    helpers = [ast.get_source_segment(source, n) or ast.unparse(n) for n in tree.body
               if isinstance(n, ast.FunctionDef) and not n.name.startswith("test") and n.name in words]
    words |= set(re.findall(r"\w+", "\n".join(helpers)))
    imports = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom | ast.Import):
            names = [a for a in node.names if (a.asname or a.name).split(".")[0] in words]
            if names:
                kept = ast.ImportFrom(node.module, names, node.level) if isinstance(node, ast.ImportFrom) \
                    else ast.Import(names)
                imports.append(ast.unparse(kept))
    return tuple(imports), tuple(helpers)


def probe_test(root: Path, test_id: str, packages: Iterable[str]) -> Symptom | None:
    """Run test ``path::name`` of the repository at ``root`` in-process; the first wrong observation, or None
    when every statement behaves."""
    rel, name = test_id.split("::", 1)
    source = (root / rel).read_text()
    tree = ast.parse(source)
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    with isolated_imports(root, packages):
        ns: dict[str, Any] = {"__name__": "repro_probe"}
        exec(compile(ast.Module([n for n in tree.body if n is not func], []), str(root / rel), "exec"), ns)
        runner = _Runner(source, ns)
        try:
            runner.run(func.body)
        except _Found as found:
            imports, helpers = _context(tree, source, "\n".join([*runner.setup, found.call]))
            return Symptom(test_id, found.call, found.observed, found.expected, tuple(runner.setup), imports, helpers)
    return None

"""Mutation operators over Python source, found with ``ast``.

A :class:`Mutation` replaces one span of one function's source text, so the rest of the file keeps its exact
formatting and the gold patch (mutant -> clean) is a small, readable diff.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

OPERATORS = ("operator_swap", "comparison_flip", "off_by_one", "wrong_constant", "negated_condition",
             "wrong_variable", "dropped_statement")
OPERATOR_GROUPS = {
    "arithmetic": ("operator_swap",),
    "comparison": ("comparison_flip", "negated_condition"),
    "constant": ("off_by_one", "wrong_constant"),
    "dataflow": ("wrong_variable", "dropped_statement"),
    "recipe": ("operator_swap", "comparison_flip", "off_by_one"),  # what the CPU miniature learned on
}

BIN_SWAP = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "/"), ast.Div: ("/", "*"),
            ast.FloorDiv: ("//", "/"), ast.Mod: ("%", "//"), ast.Pow: ("**", "*")}
BOOL_SWAP = {ast.And: ("and", "or"), ast.Or: ("or", "and")}
CMP_FLIP = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
            ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.In: ("in", "not in"),
            ast.NotIn: ("not in", "in"), ast.Is: ("is", "is not"), ast.IsNot: ("is not", "is")}
DROPPABLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Delete, ast.If)
SIMPLE_EXPR = (ast.Name, ast.Call, ast.Attribute, ast.Subscript, ast.Constant)
UNSWAPPABLE = frozenset({"self", "cls"})


@dataclass(frozen=True)
class Mutation:
    """Replace ``source[start:end]`` (``original``) by ``replacement`` inside ``function`` of ``path``.

    ``wrong`` / ``right`` name the fix the way an issue would ("the ``wrong`` should be ``right``").
    """

    path: str
    function: str
    operator: str
    start: int
    end: int
    lineno: int
    original: str
    replacement: str
    wrong: str
    right: str

    @property
    def key(self) -> str:
        """A stable id of this mutation (independent of the order it was found in)."""
        text = "\0".join([self.path, self.function, self.operator, str(self.start), str(self.end), self.replacement])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def apply(self, source: str) -> str:
        return source[:self.start] + self.replacement + source[self.end:]

    def try_apply(self, source: str) -> str | None:
        """The mutant source, or None when it does not parse."""
        mutant = self.apply(source)
        try:
            ast.parse(mutant)
        except SyntaxError:
            return None
        return mutant

    def buggy_line(self, source: str) -> str:
        """The mutant's line holding the fault, given the clean ``source`` ("" for a dropped statement)."""
        if self.operator == "dropped_statement":
            return ""
        return self.apply(source).splitlines()[self.lineno - 1]

    def fixed_line(self, source: str) -> str:
        """The clean source's line(s) at the fault (the dropped statement itself, for a drop)."""
        lines = source.splitlines()
        if self.operator == "dropped_statement":
            return self.original.rstrip("\n")
        return lines[self.lineno - 1]


class _Source:
    """Source text plus (line, UTF-8 column) -> character offset conversion."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1]
        return self.starts[lineno - 1] + len(line.encode()[:col].decode())

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def between(self, left: ast.AST, right: ast.AST) -> tuple[int, int]:
        return self.span(left)[1], self.span(right)[0]

    def line_of(self, offset: int) -> int:
        lo, hi = 0, len(self.starts) - 1
        while lo < hi - 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.starts[mid] <= offset else (lo, mid)
        return lo + 1


@dataclass
class _Ctx:
    """One function being searched: its source, its nodes (walked once) and its index-like constants."""

    src: _Source
    path: str
    function: str
    nodes: list[ast.AST]
    index_consts: set[int]
    bounds: list[ast.expr]

    def make(self, operator: str, start: int, end: int, replacement: str, wrong: str, right: str) -> Mutation:
        return Mutation(self.path, self.function, operator, start, end, self.src.line_of(start),
                        self.src.text[start:end], replacement, wrong, right)

    def token(self, operator: str, lo: int, hi: int, pattern: str, old: str, new: str) -> Mutation | None:
        """Swap the operator token ``old`` found by ``pattern`` between offsets lo and hi."""
        match = re.search(pattern, self.src.text[lo:hi])
        if match is None:
            return None
        return self.make(operator, lo + match.start(), lo + match.end(), new, new, old)


def token_pattern(symbol: str) -> str:
    """A regex for the operator ``symbol`` that does not match inside a longer operator."""
    if symbol[0].isalpha():
        return r"\b" + r"\s+".join(symbol.split()) + r"\b"
    return r"(?<![*/<>=!])" + re.escape(symbol) + r"(?![*/=])"


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef]]:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield f"{node.name}.{item.name}", item


def _body(func: ast.FunctionDef) -> list[ast.stmt]:
    body = func.body
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return body[1:]
    return body


def _nodes(func: ast.FunctionDef) -> Iterator[ast.AST]:
    for stmt in _body(func):
        yield from ast.walk(stmt)


def _operator_swaps(ctx: _Ctx, func: ast.FunctionDef) -> Iterator[Mutation | None]:
    for node in ctx.nodes:
        if isinstance(node, ast.BinOp) and type(node.op) in BIN_SWAP:
            old, new = BIN_SWAP[type(node.op)]
            yield ctx.token("operator_swap", *ctx.src.between(node.left, node.right), token_pattern(old), old, new)
        elif isinstance(node, ast.AugAssign) and type(node.op) in BIN_SWAP:
            old, new = BIN_SWAP[type(node.op)]
            lo, hi = ctx.src.between(node.target, node.value)
            yield ctx.token("operator_swap", lo, hi, token_pattern(old + "="), old + "=", new + "=")
        elif isinstance(node, ast.BoolOp):
            old, new = BOOL_SWAP[type(node.op)]
            lo, hi = ctx.src.between(node.values[0], node.values[1])
            yield ctx.token("operator_swap", lo, hi, token_pattern(old), old, new)


def _comparison_flips(ctx: _Ctx, func: ast.FunctionDef) -> Iterator[Mutation | None]:
    for node in ctx.nodes:
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            old, new = CMP_FLIP[type(op)]
            lo, hi = ctx.src.between(operands[i], operands[i + 1])
            yield ctx.token("comparison_flip", lo, hi, token_pattern(old), old, new)


def _is_len_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len"


def _index_contexts(nodes: list[ast.AST]) -> tuple[set[int], list[ast.expr]]:
    """ids of int constants used as indexes / range bounds / len() offsets, and non-constant range bounds."""
    consts: set[int] = set()
    bounds: list[ast.expr] = []
    for node in nodes:
        if isinstance(node, ast.Subscript):
            consts.update(id(n) for n in ast.walk(node.slice) if _is_int(n))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
            for arg in node.args:
                found = [n for n in ast.walk(arg) if _is_int(n)]
                consts.update(id(n) for n in found)
                if not found and isinstance(arg, SIMPLE_EXPR):
                    bounds.append(arg)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub) and _is_len_call(node.left) \
                and _is_int(node.right):
            consts.add(id(node.right))
    return consts, bounds


def _is_int(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _off_by_ones(ctx: _Ctx, func: ast.FunctionDef) -> Iterator[Mutation | None]:
    for node in ctx.nodes:
        if id(node) in ctx.index_consts:
            start, end = ctx.src.span(node)
            for value in (node.value + 1, node.value - 1):
                if value >= 0:
                    yield ctx.make("off_by_one", start, end, str(value), str(value), str(node.value))
    for node in ctx.bounds:
        start, end = ctx.src.span(node)
        text = ctx.src.text[start:end]
        for delta in (" + 1", " - 1"):
            yield ctx.make("off_by_one", start, end, text + delta, text + delta, text)


def _constant_values(value: object) -> list[object]:
    if type(value) is bool:
        return [not value]
    if type(value) is int:
        return [value + 1, value - 1] if value > 0 else [value + 1]
    if type(value) is float:
        return [value * 2 if value else 1.0]
    return []


def _wrong_constants(ctx: _Ctx, func: ast.FunctionDef) -> Iterator[Mutation | None]:
    for node in ctx.nodes:
        if not isinstance(node, ast.Constant) or id(node) in ctx.index_consts:
            continue
        start, end = ctx.src.span(node)
        for value in _constant_values(node.value):
            yield ctx.make("wrong_constant", start, end, repr(value), repr(value), ctx.src.text[start:end])


def _negated_conditions(ctx: _Ctx, func: ast.FunctionDef) -> Iterator[Mutation | None]:
    for node in ctx.nodes:
        if not isinstance(node, ast.If | ast.While | ast.IfExp):
            continue
        test = node.test
        start, end = ctx.src.span(test)
        text = ctx.src.text[start:end]
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = ctx.src.text[slice(*ctx.src.span(test.operand))]
            yield ctx.make("negated_condition", start, end, inner, inner, text)
        else:
            negated = f"not {text}" if isinstance(test, SIMPLE_EXPR) else f"not ({text})"
            yield ctx.make("negated_condition", start, end, negated, negated, text)


def _bound_names(func: ast.FunctionDef, nodes: list[ast.AST]) -> dict[str, int]:
    """Parameters (line 0) and names assigned in the body, with the line of their first binding."""
    args = func.args
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    bound = {a.arg: 0 for a in params if a is not None}
    for node in nodes:
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign | ast.For):
            targets = [node.target]
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            targets = [node.optional_vars]
        for target in targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    bound.setdefault(name.id, name.lineno)
    return {k: v for k, v in bound.items() if k not in UNSWAPPABLE}


def _wrong_variables(ctx: _Ctx, func: ast.FunctionDef) -> Iterator[Mutation | None]:
    bound = _bound_names(func, ctx.nodes)
    for node in ctx.nodes:
        if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in bound):
            continue
        start, end = ctx.src.span(node)
        for other, line in sorted(bound.items()):
            if other != node.id and line < node.lineno:
                yield ctx.make("wrong_variable", start, end, other, other, node.id)


def _blocks(func: ast.FunctionDef, nodes: list[ast.AST]) -> Iterator[list[ast.stmt]]:
    yield _body(func)
    for node in nodes:
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def _dropped_statements(ctx: _Ctx, func: ast.FunctionDef) -> Iterator[Mutation | None]:
    src = ctx.src
    for block in _blocks(func, ctx.nodes):
        if len(block) < 2:
            continue
        for stmt in block:
            if not isinstance(stmt, DROPPABLE) or (isinstance(stmt, ast.If) and stmt.orelse):
                continue
            start, end = src.starts[stmt.lineno - 1], src.starts[stmt.end_lineno]
            node_start, node_end = src.span(stmt)
            if src.text[start:node_start].strip() or src.text[node_end:end].strip():
                continue  # shares its lines with other code
            text = src.text[start:end]
            yield ctx.make("dropped_statement", start, end, "", "", text)


FINDERS = {
    "operator_swap": _operator_swaps,
    "comparison_flip": _comparison_flips,
    "off_by_one": _off_by_ones,
    "wrong_constant": _wrong_constants,
    "negated_condition": _negated_conditions,
    "wrong_variable": _wrong_variables,
    "dropped_statement": _dropped_statements,
}


def expand_operators(names: Iterable[str] | None) -> tuple[str, ...]:
    """Operator names and group names -> operator names (all of them for None / empty)."""
    names = list(names or [])
    if not names:
        return OPERATORS
    out: list[str] = []
    for name in names:
        if name not in OPERATORS and name not in OPERATOR_GROUPS:
            raise ValueError(f"unknown mutation operator {name!r}; choose from {[*OPERATORS, *OPERATOR_GROUPS]}")
        for op in OPERATOR_GROUPS.get(name, (name,)):
            if op not in out:
                out.append(op)
    return tuple(out)


class Mutator:
    """Finds candidate mutations in one module's source (parsed once), function by function."""

    def __init__(self, source: str, path: str) -> None:
        self.src = _Source(source)
        self.path = path
        self.funcs = dict(_functions(ast.parse(source)))

    def functions(self) -> list[str]:
        """Qualified names of the module-level functions and methods."""
        return list(self.funcs)

    def function_source(self, name: str) -> str:
        start, end = self.src.span(self.funcs[name])
        return self.src.text[start:end]

    def mutations(self, function: str, operators: Iterable[str] | None = None) -> list[Mutation]:
        """Candidate mutations of ``function`` in source order (syntax and tests not checked yet)."""
        func = self.funcs[function]
        nodes = list(_nodes(func))
        ctx = _Ctx(self.src, self.path, function, nodes, *_index_contexts(nodes))
        found: dict[tuple[int, int, str], Mutation] = {}
        for op in expand_operators(operators):
            for mutation in FINDERS[op](ctx, func):
                if mutation is not None and mutation.replacement != mutation.original:
                    found.setdefault((mutation.start, mutation.end, mutation.replacement), mutation)
        return sorted(found.values(), key=lambda m: (m.start, m.end, m.operator, m.replacement))


def find_mutations(source: str, path: str, operators: Iterable[str] | None = None,
                   functions: Iterable[str] | None = None) -> list[Mutation]:
    """Every candidate mutation of the functions (and methods) in ``source`` (all of them, or ``functions``).

    Candidates are not checked for syntax or for breaking tests; see :meth:`Mutation.try_apply`.
    """
    mutator = Mutator(source, path)
    names = mutator.functions() if functions is None else [f for f in mutator.functions() if f in set(functions)]
    return [m for name in names for m in mutator.mutations(name, operators)]


def function_names(source: str) -> list[str]:
    """Qualified names of the module-level functions and methods in ``source``."""
    return [name for name, _ in _functions(ast.parse(source))]


def gold_patch(path: str, buggy: str, clean: str) -> str:
    """A git-style unified diff that turns ``buggy`` into ``clean`` (applies with ``git apply``)."""
    body = difflib.unified_diff(buggy.splitlines(keepends=True), clean.splitlines(keepends=True),
                                f"a/{path}", f"b/{path}", n=3)
    return f"diff --git a/{path} b/{path}\n" + "".join(body)

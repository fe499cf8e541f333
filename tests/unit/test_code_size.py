"""Small modules and functions: no module of the package over 400 lines, no function over 60 (the limits
docs/architecture.md states; a reader takes in one screenful at a time)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def sources() -> list[Path]:
    return [p for top in ("repro", "harness_adapters") for p in sorted((ROOT / top).rglob("*.py"))]


def long_functions(path: Path, limit: int, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [f"{path.relative_to(root)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno - node.lineno + 1 > limit]


def test_no_module_over_400_lines() -> None:
    long = [f"{p.relative_to(ROOT)} ({n} lines)" for p in sources() if (n := len(p.read_text().splitlines()))
            > MAX_MODULE_LINES]
    assert not long, long


def test_no_function_over_60_lines() -> None:
    long = [line for p in sources() for line in long_functions(p, MAX_FUNCTION_LINES)]
    assert not long, long


def test_the_function_check_counts_a_whole_body(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("def f():\n" + "    x = 1\n" * 3 + "\n\nasync def g():\n    pass\n")
    assert long_functions(path, 3, tmp_path) == ["m.py:1 f (4 lines)"]  # async ones count too, under the limit

"""Package layering: the serving layer knows no jobs, the harness adapters know no serving internals."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at top level or inside functions (lazy imports count)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize(("package", "forbidden"), [
    ("harness_adapters", "repro.serving"),
    ("repro/serving", "repro.experiments"),
    ("repro/tinymodel", "repro.experiments"),
    ("repro/expert", "repro.experiments"),
    ("repro/expert", "repro.serving"),
    ("repro/serving", "repro.expert"),
    ("repro/serving", "repro.testing"),
    ("harness_adapters", "repro.tinymodel"),
    ("repro/tinymodel", "repro.expert"),
    ("repro/sandbox", "repro.evaluation"),
    ("repro/sandbox", "repro.experiments"),
    ("repro/tasks", "repro.sandbox"),
    ("repro/execution", "repro.sandbox"),
    ("repro/execution", "repro.tasks"),
])
def test_package_does_not_import(package: str, forbidden: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, package
    offenders = [f"{path.relative_to(ROOT)} imports {name}" for path in files for name in imported_modules(path)
                 if name == forbidden or name.startswith(forbidden + ".")]
    assert not offenders, offenders


def test_the_checker_sees_lazy_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from repro.serving.stack import Stack\n    import repro.serving.engine\n")
    assert imported_modules(module) == {"repro.serving.stack", "repro.serving.engine"}

"""The hand-written packages shipped as task sources: each passes its own tests and has the expected shape."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from repro.execution.pytest_runner import run_pytest
from repro.tasks.bundled import BundledPackage, bundled_packages, write_tree
from repro.tasks.mutate import function_names

PACKAGES = sorted(bundled_packages())


def test_four_packages_are_shipped():
    assert PACKAGES == ["exprlex", "statlite", "stockroom", "strkit"]


@pytest.mark.parametrize("name", PACKAGES)
def test_clean_package_passes_its_own_tests(name: str, tmp_path: Path):
    package = bundled_packages()[name]
    write_tree(tmp_path, package.files())
    run = run_pytest(tmp_path, ["tests"], timeout_s=60)
    assert run.statuses, run.log[-2000:]
    assert set(run.statuses.values()) == {"PASSED"}, run.log[-2000:]
    assert len(run.statuses) >= 20


@pytest.mark.parametrize("name", PACKAGES)
def test_package_shape(name: str):
    package: BundledPackage = bundled_packages()[name]
    files = package.files()
    assert "conftest.py" in files and package.test_files()
    count = sum(len(function_names(files[m])) for m in package.modules())
    assert 8 <= count <= 16, count
    allowed = {name, "pytest"} | set(sys.stdlib_module_names)
    for rel, text in files.items():
        text.encode("ascii")  # ASCII only: mutation offsets stay simple
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                assert node.module.split(".")[0] in allowed, (rel, node.module)
            elif isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] in allowed for a in node.names), rel


def test_packages_are_data_outside_repro():
    from repro_taskdata import PACKAGES_DIR

    assert not (PACKAGES_DIR / "__init__.py").exists()
    assert PACKAGES_DIR.parent.name == "repro_taskdata"  # not under repro/: data, not its source

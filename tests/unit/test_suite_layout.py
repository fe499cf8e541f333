"""The test suite's own layout: pytest (rootdir-relative, no packages) needs unique module basenames."""

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_has_a_unique_basename() -> None:
    """Two test files with one basename make collection fail with 'import file mismatch'."""
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert names, f"no test modules found under {TESTS}"
    assert [name for name, count in names.items() if count > 1] == []

"""Issue-style statements: the probe observes the failing call; statements never show the diff."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from repro.tasks.bundled import write_tree
from repro.tasks.mutate import find_mutations
from repro.tasks.probe import Symptom, isolated_imports, probe_test
from repro.tasks.statements import make_statement

CODE = '''class Counter:
    def __init__(self):
        self.n = 0

    def bump(self, k):
        self.n = self.n + k


def half(x):
    return x / 2


def check(x):
    if x < 0:
        raise ValueError("negative")
    return x
'''

TESTS = '''import pytest

from demo.core import Counter, check, half


def fresh():
    return Counter()


def test_half():
    assert half(10) == 5
    assert half(4) == pytest.approx(2.0)


def test_bump():
    c = fresh()
    c.bump(3)
    assert c.n == 3


def test_check():
    with pytest.raises(ValueError):
        check(-1)


def test_fine():
    assert check(1) == 1
'''


def repo(root: Path, code: str) -> Path:
    write_tree(root, {"demo/__init__.py": "", "demo/core.py": code, "tests/test_demo.py": TESTS, "conftest.py": ""})
    return root


def mutate(original: str, replacement: str) -> str:
    mutation = next(m for m in find_mutations(CODE, "demo/core.py") if (m.original, m.replacement) ==
                    (original, replacement))
    return mutation.apply(CODE)


def test_probe_reports_the_first_wrong_value(tmp_path: Path):
    root = repo(tmp_path, mutate("/", "*"))
    found = probe_test(root, "tests/test_demo.py::test_half", ["demo"])
    assert found.sentence() == "`half(10)` returns `20`, expected `5`."
    assert found.snippet() == "from demo.core import half\n\nhalf(10)  # returns 20, expected 5"


def test_probe_keeps_setup_and_helpers(tmp_path: Path):
    root = repo(tmp_path, mutate("+", "-"))
    found = probe_test(root, "tests/test_demo.py::test_bump", ["demo"])
    assert (found.call, found.observed, found.expected) == ("c.n", "is `-3`", "`3`")
    assert found.setup == ("c = fresh()", "c.bump(3)")
    assert found.imports == ("from demo.core import Counter",)
    assert found.helpers == ("def fresh():\n    return Counter()",)


def test_probe_reports_a_missing_exception(tmp_path: Path):
    root = repo(tmp_path, mutate("<", "<="))  # still raises for -1: nothing to report
    assert probe_test(root, "tests/test_demo.py::test_check", ["demo"]) is None
    root = repo(tmp_path / "b", mutate("x < 0", "not (x < 0)"))
    found = probe_test(root, "tests/test_demo.py::test_check", ["demo"])
    assert found.sentence() == "`check(-1)` does not raise `ValueError`."


def test_probe_leaves_the_process_modules_alone(tmp_path: Path):
    root = repo(tmp_path, CODE)
    assert "demo" not in sys.modules
    with isolated_imports(root, ["demo"]):
        import demo.core  # noqa: F401

        assert "demo.core" in sys.modules
    assert "demo" not in sys.modules and "demo.core" not in sys.modules and str(root) not in sys.path


SYMPTOM = Symptom("tests/test_f.py::test_f", "f(1, 2)", "returns `-2`", "`4`")


def test_one_step_pins_location_and_multi_step_only_the_symptom():
    mutation = next(m for m in find_mutations(CODE, "demo/core.py") if (m.original, m.replacement) == ("/", "*"))
    symptom = Symptom("tests/test_demo.py::test_half", "half(10)", "returns `20`", "`5`",
                      imports=("from demo.core import half",))
    quoted = make_statement("one_step", symptom, mutation, CODE, quote_line=True)
    assert "on the line `return x * 2`. The `*` should be `/`." in quoted
    located = make_statement("one_step", symptom, mutation, CODE, quote_line=False)
    assert "`half` in `demo/core.py` (around line 10)" in located and "return x" not in located
    multi = make_statement("multi_step", symptom, mutation, CODE, quote_line=True)
    assert "`half(10)` returns `20`, expected `5`." in multi
    assert "return x" not in multi and "demo/core.py" not in multi and "should be" not in multi
    with pytest.raises(ValueError, match="unknown difficulty"):
        make_statement("easy", symptom, mutation, CODE, quote_line=True)


def test_multi_step_statement_that_would_quote_the_fault_is_refused():
    mutation = next(m for m in find_mutations(CODE, "demo/core.py") if (m.original, m.replacement) == ("/", "*"))
    symptom = Symptom("t::t", "x / 2", "returns `1`", "`2`")  # the reproduction happens to hold the fixed code
    assert make_statement("multi_step", symptom, mutation, CODE, quote_line=True) is not None
    leaky = Symptom("t::t", "return x / 2", "returns `1`", "`2`")
    assert make_statement("multi_step", symptom=leaky, mutation=mutation, clean_source=CODE, quote_line=True) is None


def test_brief_one_step_statement_keeps_test_symptom_and_fix_but_drops_the_reproduction():
    mutation = next(m for m in find_mutations(CODE, "demo/core.py") if (m.original, m.replacement) == ("/", "*"))
    symptom = Symptom("tests/test_demo.py::test_half", "half(10)", "returns `20`", "`5`",
                      imports=("from demo.core import half",))
    brief = make_statement("one_step_brief", symptom, mutation, CODE, quote_line=True)
    full = make_statement("one_step", symptom, mutation, CODE, quote_line=True)
    assert brief.startswith("The test `tests/test_demo.py::test_half` fails: `half(10)` returns `20`, expected `5`.")
    assert "on the line `return x * 2`. The `*` should be `/`." in brief
    assert "```" not in brief and "```python" in full and len(brief) < len(full)


def test_fix_hint_names_which_of_several_equal_operators_is_wrong():
    source = "def f(a, b):\n    return a - b + 1\n"  # mutants: `a - b - 1` and `a + b + 1`
    second = next(m for m in find_mutations(source, "f.py") if m.operator == "operator_swap" and m.start > 28)
    first = next(m for m in find_mutations(source, "f.py") if m.operator == "operator_swap" and m.start < 28)
    assert "The second `-` should be `+`." in make_statement("one_step", SYMPTOM, second, source, quote_line=True)
    assert "The first `+` should be `-`." in make_statement("one_step", SYMPTOM, first, source, quote_line=True)
    single = "def g(a):\n    return a + 1\n"
    only = next(m for m in find_mutations(single, "g.py") if m.operator == "operator_swap")
    assert "The `-` should be `+`." in make_statement("one_step", SYMPTOM, only, single, quote_line=True)

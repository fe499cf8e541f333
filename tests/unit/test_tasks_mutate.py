"""Mutation operators: each one finds its sites, replaces exactly one span, and the gold patch undoes it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from repro.tasks.mutate import OPERATORS, Mutator, expand_operators, find_mutations, gold_patch

SOURCE = '''"""Module docstring."""

LIMIT = 10


def total(values, start):
    """Sum from ``start``."""
    acc = start
    for index in range(len(values) - 1):
        acc += values[index + 1]
    if acc > LIMIT and not values:
        return 0
    return acc * 2


class Box:
    def grow(self, n):
        self.size = n - 1
        return self.size == 3
'''


def mutants(operator: str) -> set[tuple[str, str, str]]:
    return {(m.function, m.original, m.replacement) for m in find_mutations(SOURCE, "mod.py", [operator])}


def test_operator_swap():
    found = mutants("operator_swap")
    assert ("total", "+=", "-=") in found
    assert ("total", "*", "/") in found
    assert ("total", "and", "or") in found
    assert ("total", "-", "+") in found  # len(values) - 1
    assert ("Box.grow", "-", "+") in found


def test_comparison_flip():
    assert mutants("comparison_flip") == {("total", ">", ">="), ("Box.grow", "==", "!=")}


def test_off_by_one_hits_ranges_and_indexes_only():
    found = mutants("off_by_one")
    assert ("total", "1", "2") in found and ("total", "1", "0") in found
    assert all(fn == "total" for fn, _, _ in found)  # `n - 1` and `== 3` are not index-like


def test_wrong_constant():
    found = mutants("wrong_constant")
    assert ("total", "0", "1") in found and ("total", "2", "3") in found
    assert ("Box.grow", "3", "4") in found
    assert not any(orig == "1" and fn == "total" for fn, orig, _ in found)  # index constants are off_by_one's


def test_negated_condition():
    found = mutants("negated_condition")
    assert ("total", "acc > LIMIT and not values", "not (acc > LIMIT and not values)") in found


def test_wrong_variable_uses_names_bound_earlier():
    found = mutants("wrong_variable")
    assert ("total", "acc", "start") in found
    # `start` is read on the line that binds `acc`, before `index` exists: neither may replace it
    assert ("total", "start", "acc") not in found and ("total", "start", "index") not in found
    assert not any("self" in (orig, new) for _, orig, new in found)


def test_dropped_statement_keeps_blocks_non_empty():
    found = {orig.strip() for _, orig, _ in mutants("dropped_statement")}
    assert "acc = start" in found and "self.size = n - 1" in found
    assert "acc += values[index + 1]" not in found  # the only statement of its loop body


def test_every_candidate_replaces_one_span_and_parses():
    for mutation in find_mutations(SOURCE, "mod.py"):
        mutant = mutation.apply(SOURCE)
        assert mutant[:mutation.start] == SOURCE[:mutation.start]
        assert mutation.try_apply(SOURCE) == mutant
        assert mutation.operator in OPERATORS


def test_docstrings_and_module_level_code_are_never_mutated():
    for mutation in find_mutations(SOURCE, "mod.py"):
        assert mutation.lineno > 5
        assert "docstring" not in mutation.original and "Sum from" not in mutation.original


def test_groups_and_unknown_operator():
    assert expand_operators(["recipe"]) == ("operator_swap", "comparison_flip", "off_by_one")
    assert expand_operators([]) == OPERATORS
    with pytest.raises(ValueError, match=r"unknown mutation operator 'typo'.*operator_swap"):
        expand_operators(["typo"])


def test_buggy_and_fixed_lines():
    mutation = next(m for m in find_mutations(SOURCE, "mod.py", ["comparison_flip"]) if m.function == "total")
    assert mutation.buggy_line(SOURCE).strip() == "if acc >= LIMIT and not values:"
    assert mutation.fixed_line(SOURCE).strip() == "if acc > LIMIT and not values:"
    assert (mutation.wrong, mutation.right) == (">=", ">")


def test_function_source():
    assert Mutator(SOURCE, "mod.py").function_source("Box.grow").startswith("def grow(self, n):")


def test_gold_patch_applies_with_git(tmp_path: Path):
    mutation = find_mutations(SOURCE, "pkg/mod.py", ["dropped_statement"])[0]
    mutant = mutation.apply(SOURCE)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(mutant)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "fix.patch").write_text(gold_patch("pkg/mod.py", mutant, SOURCE))
    subprocess.run(["git", "apply", "fix.patch"], cwd=tmp_path, check=True)
    assert (tmp_path / "pkg" / "mod.py").read_text() == SOURCE

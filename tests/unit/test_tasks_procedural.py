"""The procedural family: seeded modules with generated tests, and in-process validation that agrees with pytest."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from repro.execution.pytest_runner import run_pytest
from repro.tasks.bundled import write_tree
from repro.tasks.mutate import find_mutations
from repro.tasks.procedural import WORDS, ProceduralConfig, generate_module, module_seed, run_cases, verdict


def test_same_seed_same_module_and_splits_use_different_streams():
    assert generate_module(11).source == generate_module(11).source
    assert generate_module(11).test_source == generate_module(11).test_source
    assert generate_module(11).source != generate_module(12).source
    assert module_seed(0, "train", 0) != module_seed(0, "test", 0) != module_seed(1, "train", 0)


def test_module_shape():
    cfg = ProceduralConfig(min_functions=3, max_functions=6, cases_per_function=3)
    for seed in range(30):
        module = generate_module(seed, cfg)
        funcs = [n for n in ast.parse(module.source).body if isinstance(n, ast.FunctionDef)]
        assert 3 <= len(funcs) <= 6
        assert module.name in WORDS and all(f.name in WORDS for f in funcs)
        assert len(module.cases) == 3 * len(funcs)
        assert verdict(module, run_cases(module, module.source)).failing == ()


def test_clean_module_passes_its_generated_tests_under_pytest(tmp_path: Path):
    module = generate_module(5)
    write_tree(tmp_path, module.files())
    statuses = run_pytest(tmp_path, [module.test_path], timeout_s=60).statuses
    assert statuses == {c.test_id: "PASSED" for c in module.cases}


def test_in_process_validation_agrees_with_pytest(tmp_path: Path):
    """A sample of mutants (kept and rejected ones) judged in-process and by real pytest."""
    checked = kept = 0
    for seed in (1, 2, 3):
        module = generate_module(seed)
        mutations = find_mutations(module.source, module.path)
        for mutation in mutations[:: max(1, len(mutations) // 3)][:3]:
            mutant = mutation.apply(module.source)
            outcomes = run_cases(module, mutant)
            if outcomes is None:
                continue
            expected = verdict(module, outcomes)
            root = tmp_path / f"{seed}-{checked}"
            write_tree(root, {**module.files(), module.path: mutant})
            statuses = run_pytest(root, [module.test_path], timeout_s=60).statuses
            assert set(statuses) == {c.test_id for c in module.cases}
            assert {t for t, s in statuses.items() if s != "PASSED"} == set(expected.failing), mutation
            checked += 1
            kept += expected.keeps
    assert checked >= 6 and 0 < kept < checked


def test_code_that_runs_too_long_is_rejected(monkeypatch: pytest.MonkeyPatch):
    import repro.tasks.procedural as procedural

    monkeypatch.setattr(procedural, "CASE_BUDGET_S", 0.2)
    module = generate_module(1)
    first = module.cases[0].function
    endless = f"def {first}(*_):\n    while True:\n        pass\n\n\ndef old_{first}("
    hung = module.source.replace(f"def {first}(", endless, 1)
    assert run_cases(module, hung) is None
    assert run_cases(module, module.source) is not None

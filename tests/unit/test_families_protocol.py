"""What a gain is made of and what the records say of the protocol: per-family rows with slipped edits, p-values
at their Monte Carlo floor printed as bounds, identical outcomes said in words, and the split's use dated from the
records."""

from __future__ import annotations

from repro.evaluation.paired import SIGN_FLIP_RESAMPLES, paired_summary
from repro.report.before_after import run_markdown
from repro.report.cells import IDENTICAL, paired_cells, sign_flip_cell
from repro.report.family_sections import family_of, family_rows, summed_slips
from repro.report.protocol import count_split_use, protocol_note, split_name


def _id(op: str, i: int) -> str:
    return f"repro-bundled__procedural-s0-test-f{i}.g-{op}-lc-{i:08x}"


def test_the_family_of_an_instance_is_its_operator_or_its_repository() -> None:
    assert family_of(_id("off_by_one", 3)) == "off_by_one"
    assert family_of("repro-bundled__procedural-s0-test-f.g-comparison_flip-1b-00") == "comparison_flip"
    assert family_of("django__django-11099") == "django/django"
    assert family_of("sphinx-doc__sphinx-8721") == "sphinx-doc/sphinx"
    assert family_of("task-7") == "other"


def _planted() -> tuple[dict[str, float], dict[str, float]]:
    """30 slip-free tasks that never move, 10 slip tasks of which 8 go from failed to solved."""
    before = {_id("operator_swap", i): float(i < 3) for i in range(30)} | {_id("off_by_one", i): 0.0 for i in range(10)}
    after = dict(before) | {_id("off_by_one", i): float(i < 8) for i in range(10)}
    return before, after


def test_a_gain_made_of_one_family_shows_as_that_family() -> None:
    before, after = _planted()
    slips_before = summed_slips([{"by_operator": {"off_by_one": [9, 10], "operator_swap": [0, 30]}}])
    slips_after = summed_slips([{"by_operator": {"off_by_one": [1, 10], "operator_swap": [0, 30]}}])
    rows = {r["family"]: r for r in family_rows(before, after, slips_before, slips_after)}
    assert list(rows) == ["operator_swap", "off_by_one", "all"]  # largest family first, the total last
    assert rows["operator_swap"]["delta [95% CI]"] == IDENTICAL and rows["operator_swap"]["MDE"] == "-"
    assert rows["off_by_one"]["Pass@1 before"] == "0.0%" and rows["off_by_one"]["Pass@1 after"] == "80.0%"
    assert rows["off_by_one"]["delta [95% CI]"].startswith("+80.0 [")
    assert rows["off_by_one"]["slipped edits before -> after"] == "90.0% -> 10.0%"
    assert rows["all"]["tasks"] == 40 and rows["all"]["delta [95% CI]"].startswith("+20.0 [")
    assert rows["all"]["slipped edits before -> after"] == "22.5% -> 2.5%"
    assert family_rows(before, after)[0]["slipped edits before -> after"] == "-"  # not counted: not invented
    assert summed_slips([{"by_operator": {"x": [1, 2]}}, None]) is None  # one seed uncounted: no pooled count


def test_tables_print_the_family_breakdown_pooled_over_seeds() -> None:
    before, after = _planted()
    runs = []
    for seed in (0, 1):
        runs.append({"kind": "before_after", "experiment": "mini_repro", "table": "mini_repro", "seed": seed,
                     "run_dir": f"outputs/mini_repro/x/{seed}", "fingerprint": "abc", "task_distribution": "t",
                     "train_tasks": "tr", "before": {"pass_at_1": 0.1, "ci": {"low": 0, "high": 0.2}},
                     "after": {"pass_at_1": 0.3, "ci": {"low": 0.2, "high": 0.4}}, "wall_s": 1.0,
                     "paired": {"n": 40, "delta": 0.2, "delta_low": 0.1, "delta_high": 0.3},
                     "samples": {"mode": "prefix_merge", "weighting": "rollout"},
                     "rl": {"config": {"seed": seed, "steps": 1, "tasks_per_step": 1, "samples_per_task": 1}},
                     "trainer": {"learning_rate": 1e-3},
                     "per_instance": {"before": before, "after": after}})
    text = run_markdown(runs)
    assert "### What changed, by task family" in text
    (line,) = [x for x in text.splitlines() if x.startswith("| pooled (2 seeds)") and "off_by_one" in x]
    assert "+80.0 [" in line


def test_a_sign_flip_p_at_its_floor_is_a_bound_and_identical_outcomes_are_words() -> None:
    a = {f"t{i}": 0.0 for i in range(60)}
    b = {f"t{i}": 1.0 for i in range(60)}
    strong = paired_summary(a, b)
    assert strong["sign_flip_p"] == 1 / (SIGN_FLIP_RESAMPLES + 1) and "bootstrap_p" not in strong
    assert sign_flip_cell(strong) == "< 5e-05" and paired_cells(strong)["sign-flip p"] == "< 5e-05"
    assert sign_flip_cell({"sign_flip_p": 0.0123}) == "0.0123"
    assert sign_flip_cell({"sign_flip_p": 4.999750012499375e-05}) == "< 5e-05"  # records made before the count
    assert paired_cells(paired_summary(a, a)) == {"delta [95% CI]": IDENTICAL, "MDE": "-", "sign-flip p": "-"}
    mixed = dict(a) | {"t0": 1.0, "t1": -1.0}  # differences that cancel are not identical outcomes
    assert paired_cells(paired_summary(a, mixed))["delta [95% CI]"] != IDENTICAL


def _run(split: str, started: float, table: str, sha: str = "a" * 40) -> dict:
    return {"table": table, "experiment": table, "started_at": started, "git_sha": sha,
            "task_distribution": f"bundled:procedural:{split}:locate:n10:s0",
            "run_config": {"job": {"_target_": "repro.jobs.mini_repro.mini_repro_job"}}}


def test_the_protocol_note_dates_validation_against_the_test_runs() -> None:
    tests = [_run("test", 1000.0, "mini_repro"), _run("test", 2000.0, "mini_repro")]
    early, late = _run("validation", 500.0, "mini_repro_validation"), _run("validation", 3000.0, "v")
    assert split_name(tests[0]) == "test" and split_name(early) == "validation"
    note = protocol_note(tests, [*tests, early], key := (lambda r: ("one",)))
    assert "2 runs of 1 configuration scored the test split" in note and "`aaaaaaa`" in note
    assert "all of them started before the first test run" in note
    note = protocol_note(tests, [*tests, early, late], key)
    assert "1 of them started after the first test run here" in note
    assert "No validation run" in protocol_note(tests, tests, key)
    assert "test split" not in protocol_note([early], [early], key)  # a validation table: no verdict to give


def test_the_note_counts_every_configuration_that_scored_the_same_modules_in_any_table() -> None:
    """Seeds of one configuration count once; another size of the same stream, another table's configuration and
    another statement style on the same modules each count; another test seed is another split."""
    seeds = [_run("test", 1000.0 + i, "mini_repro") | {"seed": i} for i in range(3)]
    for i, run in enumerate(seeds):
        run["run_config"] = {"job": {"seed": i, "_target_": "mini"}, "seed": i}
    bigger = _run("test", 900.0, "mini_repro") | {"task_distribution": "bundled:procedural:test:locate:n500:s0"}
    other_style = _run("test", 950.0, "harness_sweep") | {
        "task_distribution": "bundled:procedural:test:one_step:n50:s0", "run_config": {"job": {"_target_": "eval"}}}
    fresh = _run("test", 5000.0, "mini_repro") | {"task_distribution": "bundled:procedural:test:locate:n150:s1"}
    count_split_use(runs := [*seeds, bigger, other_style, fresh])
    assert [r["split_configurations"] for r in runs] == [3, 3, 3, 3, 3, 1]
    assert seeds[0]["split_first_scored"] == 900.0 and fresh["split_first_scored"] == 5000.0
    note = protocol_note(seeds, seeds, lambda r: ("one",))
    assert "3 runs of 1 configuration" in note and "3 distinct configurations have scored these modules" in note
    assert "1 distinct configuration has scored" in protocol_note([fresh], [fresh], lambda r: ("one",))
    both = protocol_note([*seeds, fresh], [*seeds, fresh], lambda r: ("one",))  # a table whose default moved on
    assert both.count("Protocol, from the records") == 2 and "`bundled:procedural:test:locate:n150:s1`" in both


def test_the_seeds_as_the_sample_give_a_t_interval_and_test() -> None:
    from repro.evaluation.paired import across_seeds
    from repro.report.cells import seeds_cell

    found = across_seeds([0.014, 0.084, 0.090])  # the matrix's three seeds: wide, and not significant
    half = 4.302653 * 0.042252 / 3 ** 0.5  # t(0.975, 2 df) x sd / sqrt(n)
    assert abs(found["mean"] - 0.062667) < 1e-6 and abs(found["high"] - found["mean"] - half) < 1e-4
    assert 0.12 < found["p"] < 0.13 and found["low"] < 0 < found["high"]
    assert seeds_cell([0.014, 0.084, 0.090]) == "+6.3 [-4.2, +16.8], p 0.124"
    assert seeds_cell([0.1]) == "-" and seeds_cell([0.0, 0.0]) == "every seed +0.0"
    assert across_seeds([0.10, 0.11, 0.12, 0.10, 0.11])["p"] < 1e-4  # consistent seeds: clearly not 0


def test_a_validation_run_never_joins_its_experiments_test_table() -> None:
    from repro.report.table_files import by_table, table_name

    test, named = _run("test", 1.0, "mini_repro"), _run("validation", 2.0, "mini_repro_validation")
    unnamed = _run("validation", 3.0, "mini_repro")  # run under the experiment's own name
    assert [table_name(r) for r in (test, named, unnamed)] == ["mini_repro", *["mini_repro_validation"] * 2]
    assert {k: len(v) for k, v in by_table([test, named, unnamed]).items()} == {"mini_repro": 1,
                                                                             "mini_repro_validation": 2}
    assert table_name({"experiment": "bench_proxy"}) == "bench_proxy"  # no task set: no split to add

"""`repro table` for the miniature: one row per run with before, after, paired delta, tests and hours."""

from __future__ import annotations

from pathlib import Path

from repro.report.before_after import run_markdown, write_before_after_tables


def _eval(p: float) -> dict:
    return {"pass_at_1": p, "ci": {"low": p - 0.1, "high": p + 0.1}}


def _run(name: str, weighting: str, fingerprint: str = "abcdef0123", cached: bool = False) -> dict:
    return {
        "kind": "before_after", "experiment": "mini_repro", "table": "mini_repro", "run_dir": f"outputs/{name}",
        "fingerprint": fingerprint, "task_distribution": "bundled:test", "train_tasks": "bundled:train",
        "before": _eval(0.43), "after": _eval(0.45), "wall_s": 1681.0,
        "paired": {"n": 100, "delta": 0.02, "delta_low": -0.02, "delta_high": 0.06, "mcnemar_p": 0.625},
        "samples": {"mode": "prefix_merge", "weighting": weighting},
        "rl": {"config": {"seed": 0, "steps": 12, "tasks_per_step": 16, "samples_per_task": 8}},
        "trainer": {"learning_rate": 2e-4},
        "warm_start": {"key": "70f3833247a6eb42", "cached": cached, "demo_rollouts": 3000},
        "compute": {"phases": {"warm_start_sft": {"wall_s": 1108.8}, "rl_rollouts": {"wall_s": 277.2}},
                    "total": {"cpu_core_h": 0.83, "gpu_h_allocated": 0.0}},
    }


def test_rows_show_before_after_delta_tests_and_phase_hours(tmp_path: Path) -> None:
    text = run_markdown([_run("a", "rollout"), _run("b", "fragment", cached=True)])
    assert "43.0% [33.0%, 53.0%]" in text and "45.0% [35.0%, 55.0%]" in text and "+2.0 [-2.0, +6.0]" in text
    assert "0.625" in text and "ws_sft 0.308" in text and "12x16x8, lr 0.0002" in text
    assert "70f38332 (3000 demos)" in text and "70f38332 (cached)" in text
    assert "fragment" in text and "Warning" not in text


def test_rows_with_different_fingerprints_are_flagged(tmp_path: Path) -> None:
    assert "Warning" in run_markdown([_run("a", "rollout"), _run("b", "rollout", fingerprint="ffff")])
    written = write_before_after_tables([_run("a", "rollout")], tmp_path)
    assert [p.name for p in written] == ["mini_repro.md", "mini_repro.csv"]
    assert (tmp_path / "mini_repro.md").read_text().startswith("# mini_repro")


def _seeded(seed: int, after_solved: int, n: int = 40) -> dict:
    """A run whose first ``after_solved`` of ``n`` instances go from unsolved to solved (the rest stay)."""
    run = _run(f"s{seed}", "rollout")
    ids = [f"t{i:02d}" for i in range(n)]
    run["seed"] = seed
    run["rl"]["config"]["seed"] = seed
    run["per_instance"] = {"before": dict.fromkeys(ids, 0.0),
                           "after": {i: float(j < after_solved) for j, i in enumerate(ids)}}
    run["paired"] = {**run["paired"], "delta": after_solved / n, "mde": 0.05}
    run["diagnostics"] = [{"step": s, "reward_mean": 0.1 * s, "mixed_group_share": 0.5, "clip_fraction": 0.01,
                           "entropy": 1.0 - 0.1 * s, "calls_per_rollout": 1.5, "log_ratio_first_max": 2e-5,
                           "log_ratio_max": 1.0} for s in range(3)]
    return run


def test_seeds_of_one_configuration_get_a_pooled_row_and_diagnostics(tmp_path: Path) -> None:
    runs = [_seeded(0, 4), _seeded(1, 8), _seeded(2, 12)]
    text = run_markdown(runs)
    pooled = next(line for line in text.splitlines() if "pooled (3 seeds)" in line)
    # per-instance means over seeds: 12 instances gain 1/3, 8 gain 2/3... mean gain (4 + 8 + 12) / 3 / 40 = 20%
    assert "+20.0 [" in pooled and "| 10.0 " in pooled and "0,1,2" in pooled  # the seeds' own spread beside it
    assert "MDE" in text and "0.000 -> 0.200" in text and "2.0e-05" in text
    other = _seeded(3, 4)
    other["trainer"] = {"learning_rate": 1e-3}  # another configuration: no pooling across it
    assert _pooled_rows(run_markdown([*runs, other])) == 1
    written = write_before_after_tables(runs, tmp_path)
    assert {p.name for p in written} == {"mini_repro.md", "mini_repro.csv", "mini_repro_diagnostics.md",
                                         "mini_repro_diagnostics.csv", "mini_repro_diagnostics.svg",
                                         "mini_repro_families.csv"}
    assert (tmp_path / "mini_repro.csv").read_text().splitlines()[-1].startswith("pooled (3 seeds),")
    steps = (tmp_path / "mini_repro_diagnostics.csv").read_text().splitlines()
    assert len(steps) == 1 + 3 * 3 and steps[0].startswith("run,seed,step,reward_mean")


def _pooled_rows(text: str) -> int:
    """Pooled rows of the main table (the family breakdown pools too, by family)."""
    return sum(1 for line in text.splitlines() if line.startswith("| pooled (") and "prefix_merge" in line)


def test_a_single_seed_has_no_pooled_row() -> None:
    assert "pooled (" not in run_markdown([_seeded(0, 4)])


def test_calls_per_rollout_and_the_probe_are_reported() -> None:
    run = _seeded(0, 4)
    run["before"]["calls_histogram"] = {"1": 10, "3": 30}
    run["after"]["calls_histogram"] = {"3": 40}
    for step in run["diagnostics"]:
        step["calls_histogram"] = {"2": 1, "3": 3}
    run["probe"] = {"config": {"k": 4}, "reused": False, "calls_per_rollout": {"3": 8},
                    "counts": {"mixed": 5, "all_fail": 2, "all_pass": 1, "kept": 6, "kept_all_fail": 1},
                    "pass_at_k": {"1": 0.25, "2": 0.4, "3": 0.5, "4": 0.55}}
    text = run_markdown([run])
    assert "2.50 (>=3: 75%) -> 3.00 (>=3: 100%)" in text  # held-out samples, before -> after
    assert "2.75 (>=3: 75%); 2: 25%, 3: 75%" in text  # RL rollouts over all steps, with the distribution
    assert "8 x 4" in text and "5 / 2 / 1" in text and "6 (1)" in text and "25 40 50 55" in text
    assert "RL task filter" in text and "min 16" not in text
    run["probe"]["fallback"] = {"rule": "unfiltered", "kept_by_filter": 6, "min_tasks": 16, "tasks": 8}
    assert "6 (1); < min 16: unfiltered, all 8" in run_markdown([run])  # the run fell back: the row says so
    del run["probe"]
    assert "RL task filter" not in run_markdown([run])


def test_an_ablation_is_compared_with_the_default_over_shared_seeds() -> None:
    defaults = [_seeded(s, 8) for s in (0, 1, 2)]
    fragment = [_seeded(s, 4) for s in (0, 1)]
    for run in defaults:
        run["overrides"] = ["experiment=mini_repro", f"seed={run['seed']}"]
    for run in fragment:
        run["overrides"] = ["experiment=mini_repro", f"seed={run['seed']}", "trainer.weighting=fragment"]
        run["samples"] = {**run["samples"], "weighting": "fragment"}
    text = run_markdown([*defaults, *fragment])
    (line,) = [x for x in text.splitlines() if x.startswith("| trainer.weighting=fragment")]
    # seeds 0 and 1 only; the default solves instances 0-7 after RL, the ablation 0-3: 4 of 40 fewer
    assert "| 0,1 " in line and "20.0% [" in line and "10.0% [" in line and "-10.0 [" in line
    assert "Against the default configuration" in text
    assert "Rebuild: `repro run -m experiment=mini_repro seed=0,1,2`" in text
    for run in [*defaults, *fragment]:  # a table named by run.name still names the experiment config that ran
        run["overrides"][0] = "experiment=mini_repro_one_call"
    assert "Rebuild: `repro run -m experiment=mini_repro_one_call " in run_markdown([*defaults, *fragment])
    for run in defaults:
        run["overrides"].append("rl.steps=3")  # no default configuration among the runs: no comparison
    assert "Against the default" not in run_markdown([*defaults, *fragment])


def test_a_run_that_failed_is_listed_under_its_table(tmp_path: Path, monkeypatch) -> None:
    import json

    from repro.cli.runner import ERROR_FILE, record_failure
    from repro.report.tables import write_tables

    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "outputs" / "mini_repro" / "20261201-153837"
    for job in ("0", "1"):
        (sweep / job).mkdir(parents=True)
    finished = _seeded(0, 4)
    finished["run_dir"] = str(sweep / "0")
    (sweep / "0" / "metrics.json").write_text(json.dumps(finished))
    record_failure(sweep / "1", ["experiment=mini_repro", "seed=1"], SystemExit("the probe kept 1 RL tasks"), job=1)
    (tmp_path / "outputs" / "other" / "x").mkdir(parents=True)  # another table's failure stays out of this one
    record_failure(tmp_path / "outputs" / "other" / "x", ["seed=2"], RuntimeError("boom"))
    other = json.loads((tmp_path / "outputs" / "other" / "x" / ERROR_FILE).read_text())
    assert other["error"] == "RuntimeError: boom" and "RuntimeError" in other["traceback"] and other["job"] is None
    write_tables(tmp_path / "outputs", tmp_path / "results")
    text = (tmp_path / "results" / "mini_repro.md").read_text()
    assert "## Runs that did not finish" in text
    assert ("`outputs/mini_repro/20261201-153837/1` (`experiment=mini_repro seed=1`): the probe kept 1 RL tasks"
            in text)
    assert "boom" not in text and "20261201-153837/0 " in text  # the finished seed keeps its row


def test_runs_whose_job_configs_differ_beyond_the_seed_are_not_pooled() -> None:
    def configured(seed: int, epochs: int) -> dict:
        run = _seeded(seed, 4 + seed)
        run["run_config"] = {"seed": seed, "job": {"model": {"seed": seed}, "warm_start": {"sft": {"epochs": epochs,
                                                                                              "seed": seed}}}}
        return run

    assert _pooled_rows(run_markdown([configured(0, 10), configured(1, 10)])) == 1
    text = run_markdown([configured(0, 10), configured(1, 15)])  # another warm start: two configurations of 1 seed
    assert "pooled (" not in text


def test_an_ablation_is_compared_with_the_default_of_its_own_evaluation() -> None:
    """A default that moved to a new test split (another fingerprint) is the reference of the ablations run there,
    whatever earlier defaults the table also holds (before, the first default group alone was a reference)."""
    earlier = [_seeded(s, 2) for s in (0, 1)]
    defaults = [_seeded(s, 8) for s in (0, 1)]
    fragment = [_seeded(s, 4) for s in (0, 1)]
    for run in earlier:
        run["fingerprint"] = "0ld5p1it00"
    for run in [*earlier, *defaults]:
        run["overrides"] = ["experiment=mini_repro", f"seed={run['seed']}"]
    for run in fragment:
        run["overrides"] = ["experiment=mini_repro", f"seed={run['seed']}", "trainer.weighting=fragment"]
        run["samples"] = {**run["samples"], "weighting": "fragment"}
    text = run_markdown([*earlier, *defaults, *fragment])
    (line,) = [x for x in text.splitlines() if x.startswith("| trainer.weighting=fragment")]
    assert "20.0% [" in line and "10.0% [" in line and "-10.0 [" in line  # against the 8-solved default, not 2


def test_family_rows_name_their_configuration() -> None:
    """Pooled family rows of the default and of an ablation are told apart by the overrides and the split."""
    defaults, fragment = [_seeded(s, 8) for s in (0, 1)], [_seeded(s, 4) for s in (0, 1)]
    for run in defaults:
        run["overrides"] = ["experiment=mini_repro", f"seed={run['seed']}"]
    for run in fragment:
        run["overrides"] = ["experiment=mini_repro", f"seed={run['seed']}", "trainer.weighting=fragment"]
        run["samples"] = {**run["samples"], "weighting": "fragment"}
    for run in [*defaults, *fragment]:
        run["task_distribution"] = "bundled:procedural:test:locate:n40:s2"
    lines = [x.split("|")[1:6] for x in run_markdown([*defaults, *fragment]).splitlines()
             if x.startswith("| pooled") and "| all " in x]
    assert [[c.strip() for c in cells] for cells in lines] == [
        ["pooled (2 seeds)", "0,1", "-", "procedural:test:s2", "all"],
        ["pooled (2 seeds)", "0,1", "trainer.weighting=fragment", "procedural:test:s2", "all"]]

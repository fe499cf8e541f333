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
        "paired": {"n": 100, "delta": 0.02, "delta_low": -0.02, "delta_high": 0.06, "mcnemar_p": 0.625,
                   "bootstrap_p": 0.444},
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

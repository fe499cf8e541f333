"""`repro table` for the loop comparison: rows per seed and arm, pooled rows per arm and for rebuilt - proxy."""

from __future__ import annotations

import re
from pathlib import Path

from repro.report.loop_comparison_table import comparison_markdown, write_loop_comparison_tables

IDS = [f"t{i:02d}" for i in range(40)]


def _eval(p: float) -> dict:
    return {"pass_at_1": p, "ci": {"low": p - 0.1, "high": p + 0.1}, "k": 4}


def _paired(delta: float) -> dict:
    return {"n": 40, "delta": delta, "delta_low": delta - 0.05, "delta_high": delta + 0.05, "sign_flip_p": 0.5,
            "mde": 0.04}


def _arm(solved: int, seed: int) -> dict:
    steps = [{"step": s, "reward_mean": 0.2, "mixed_group_share": 0.5, "clip_fraction": 0.0, "entropy": 0.9,
              "calls_per_rollout": 1.0, "log_ratio_first_max": 1e-5, "log_ratio_max": 0.5} for s in range(2)]
    return {"after": _eval(solved / 40), "paired_vs_before": _paired(solved / 40),
            "per_instance": {i: float(j < solved) for j, i in enumerate(IDS)}, "diagnostics": steps,
            "history": [], "weights_sha256": f"{seed:02d}" * 32, "compute": {"phases": {}, "total": {}}}


def _run(seed: int, proxy_solved: int, rebuilt_solved: int) -> dict:
    return {
        "kind": "loop_comparison", "experiment": "loop_comparison", "table": "loop_comparison", "seed": seed,
        "run_dir": f"outputs/loop_comparison/s{seed}", "fingerprint": "abcdef012345", "train_tasks": "train",
        "task_distribution": "test", "eval_temperature": 1.0, "before": _eval(0.0),
        "per_instance_before": dict.fromkeys(IDS, 0.0), "warm_start": {"key": f"{seed}" * 16},
        "arms": {"proxy": _arm(proxy_solved, seed), "rebuilt": _arm(rebuilt_solved, seed)},
        "rebuilt_minus_proxy": _paired((rebuilt_solved - proxy_solved) / 40), "fidelity": {},
        "rl": {"steps": 2, "tasks_per_step": 2, "samples_per_task": 2, "seed": seed},
        "trainer": {"learning_rate": 5e-4, "seed": seed}, "samples": {"mode": "prefix_merge", "weighting": "rollout"},
    }


def test_seeds_pool_per_arm_and_for_the_difference(tmp_path: Path) -> None:
    runs = [_run(0, 4, 8), _run(1, 8, 8), _run(2, 12, 8)]
    text = comparison_markdown(runs)
    pooled = [line for line in text.splitlines() if "pooled (3 seeds)" in line]
    assert len(pooled) == 3  # proxy, rebuilt, rebuilt - proxy
    proxy, rebuilt, between = pooled
    assert "| proxy " in proxy and "+20.0 [" in proxy and "| 10.0 " in proxy  # mean gain 8/40; seed sd 10 points
    assert "+20.0 [" in rebuilt and "| 0.0 " in rebuilt
    assert "rebuilt - proxy" in between and "+0.0 [" in between
    assert "RL diagnostics per arm" in text and "s0/proxy" in text
    assert "seed 0: `00000000`, seed 1: `11111111`, seed 2: `22222222`" in text  # each seed's own warm start
    written = write_loop_comparison_tables(runs, tmp_path)
    assert {p.name for p in written} == {"loop_comparison.md", "loop_comparison.csv",
                                         "loop_comparison_diagnostics.md", "loop_comparison_diagnostics.csv",
                                         "loop_comparison_diagnostics.svg", "loop_comparison_families.csv"}
    assert len((tmp_path / "loop_comparison_diagnostics.csv").read_text().splitlines()) == 1 + 3 * 2 * 2


def test_arm_rows_show_pass_at_k_before_and_after() -> None:
    run = _run(0, 4, 8)
    run["before"]["pass_at_k"] = {"1": 0.0, "4": 0.1}
    run["arms"]["proxy"]["after"]["pass_at_k"] = {"1": 0.1, "4": 0.3}
    run["arms"]["rebuilt"]["after"]["pass_at_k"] = {"1": 0.2, "4": 0.35}
    text = comparison_markdown([run])
    assert "@4: 10.0% -> 30.0%" in text and "@4: 10.0% -> 35.0%" in text


def test_one_seed_has_no_pooled_rows() -> None:
    assert "pooled (" not in comparison_markdown([_run(0, 4, 8)])


def test_fidelity_rows_name_the_tokenizer() -> None:
    from repro.report.loop_comparison_table import fidelity_rows

    fid = {"rollouts": 2, "turns": 6, "divergent_turns": 1, "divergence_rate": 1 / 6, "first_divergent_turns": [2],
           "rebuilt_drift_rate": 0.0, "rebuilt_exits": {"Submitted": 2}, "example": None}
    old = _run(0, 10, 10) | {"fidelity": {"2.4.6": fid}}  # recorded no tokenizer: the recipe BPE
    qwen = old | {"run_config": {"model": {"tokenizer": "qwen3"}}}
    assert [r["tokenizer"] for r in fidelity_rows(old)] == ["recipe BPE"]
    assert [r["tokenizer"] for r in fidelity_rows(qwen)] == ["Qwen3 (151,669 ids)"]
    assert re.search(r"\| recipe BPE +\|", comparison_markdown([old]))

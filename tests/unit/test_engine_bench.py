"""The engine comparison's pieces (``experiment=bench_engines``; the run itself needs vLLM: results/vllm_cpu.md):
memory of a process tree, tokens of a phase's time window, and the published table with its end-to-end ratio."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from repro.experiments.bench.engines import completion_tokens, tree_rss_mb
from repro.report.engines_table import engine_frame, engines_markdown
from repro.report.tables import write_kind_tables


def test_the_memory_of_a_process_tree_is_measured_and_a_gone_process_is_zero() -> None:
    assert tree_rss_mb(os.getpid()) > 10
    assert tree_rss_mb(None) == 0.0 and tree_rss_mb(2**22 + 12345) == 0.0


def test_completion_tokens_count_the_calls_that_started_in_the_window(tmp_path: Path) -> None:
    store = tmp_path / "traces.sqlite"
    with sqlite3.connect(store) as db:
        db.execute("CREATE TABLE calls (t_start REAL, completion_tokens INTEGER)")
        db.executemany("INSERT INTO calls VALUES (?, ?)", [(1.0, 10), (2.0, 20), (3.0, None), (4.0, 40)])
    assert completion_tokens(store, 2.0, 4.0) == 20 and completion_tokens(store, 0.0, 9.0) == 70


def _engine(name: str, wall: float, syncs: list[float], checks: list[bool]) -> dict:
    phases = {p: {"wall_s": wall / 4, "completion_tokens": 100, "tokens_per_s": 400 / wall}
              for p in ("eval_before", "rl", "eval_after")}
    return {"engine": name, "dtype": "float32", "startup_s": wall / 4, "phases": phases, "wall_s": wall,
            "rss_peak_mb": {"startup": 100.0, "eval_before": 300.0}, "pass_at_1": {"before": 0.1, "after": 0.3, "n": 8},
            "rl": {"sync_s": syncs, "reload_checks": [{"passed": c} for c in checks]}}


def _metrics() -> dict:
    parity = [{"engine": "vllm", "served_dtype": d, "rows": 8, "tokens": 90, "max_abs_diff": m, "mean_abs_diff": m / 9,
               "within_tolerance": m < 0.1} for d, m in (("float32", 1e-5), ("bfloat16", 0.13))]
    return {"kind": "engine_comparison", "run_dir": "outputs/bench_engines/x", "warm_start": {"key": "k"},
            "eval": {"n_tasks": 8, "k": 1, "temperature": 1.0},
            "rl": {"steps": 2, "tasks_per_step": 4, "samples_per_task": 2}, "bench": {"bf16_tasks": 3},
            "engines": [_engine("cpu", 100.0, [0.1, 0.1], [True, True]),
                        _engine("vllm", 150.0, [3.0, 4.0], [True, False])], "parity": parity}


def test_the_table_has_a_row_per_engine_the_syncs_and_checks_and_the_end_to_end_ratio(tmp_path: Path) -> None:
    frame = engine_frame(_metrics())
    assert list(frame["engine"]) == ["cpu", "vllm"]
    assert list(frame["sync_s_mean"]) == [0.1, 3.5] and list(frame["reload_checks_passed"]) == ["2/2", "1/2"]
    assert list(frame["rss_peak_mb"]) == [300.0, 300.0]
    text = engines_markdown([_metrics()])
    assert "vLLM 150 s, the CPU engine 100 s (ratio 1.50)" in text and "| bfloat16" in text
    written = write_kind_tables({"engine_comparison": [_metrics()]}, tmp_path)
    assert {p.name for p in written} == {"vllm_cpu.md", "vllm_cpu.csv"}

"""``results/bench_harnesses.md`` and ``.csv``: the per-harness cost benchmark's newest run
(:mod:`repro.experiments.bench.harnesses`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from repro.report.table_files import source_line, write_newest_table

REFERENCE = "mini_swe_agent"  # the harness the others are compared with (its first arm)


def harness_bench_frame(metrics: dict[str, Any]) -> pd.DataFrame:
    """One row per arm: CPU and wall seconds per rollout, split harness side / model server, and the multiple of
    the reference arm's harness-side CPU."""
    arms = metrics["arms"]
    reference = next((a for a in arms if a["harness"] == REFERENCE), arms[0])
    rows = []
    for arm in arms:
        rows.append({
            "harness and launcher": arm["label"], "isolation": arm["isolation"],
            "resolved": f"{arm['resolved']}/{arm['rollouts']}", "calls": arm["calls_per_rollout"],
            "wall_s": arm["wall_s"], "cpu_s": arm["cpu_s"], "harness_side_cpu_s": arm["harness_side_cpu_s"],
            "server_cpu_s": arm["server_cpu_s"],
            "x_reference": round(arm["harness_side_cpu_s"] / max(reference["harness_side_cpu_s"], 1e-9), 1),
            "startup_cpu_s": arm["startup_cpu_s"], "startup_wall_s": arm["startup_wall_s"]})
    return pd.DataFrame(rows)


def harness_bench_markdown(runs: list[dict[str, Any]]) -> str:
    """Markdown for the newest harness benchmark run, with its provenance."""
    metrics = runs[-1]
    cfg = metrics["config"]
    reference = next((a for a in metrics["arms"] if a["harness"] == REFERENCE), metrics["arms"][0])
    lines = [
        "# What a rollout costs in each harness",
        "",
        f"Each arm: the scripted expert solves the same {cfg['rollouts']} bundled `locate` tasks (three shell calls "
        "and the end of the turn) through the harness, unchanged, and the real recording proxy, graded by the real "
        "grader, one rollout at a time, after "
        f"{cfg['warmup']} warm-up rollout(s) on other tasks (where long-lived launchers start: their start-up, the "
        "warm-up's cost less as many measured rollouts', is the last two columns). Per rollout, from the whole "
        "process tree: `cpu_s` everything, `server_cpu_s` the "
        "model server (the expert: no model prefill), `harness_side_cpu_s` the rest (the harness's processes, "
        "the proxy, the grader, the orchestration; proxy and grader are the same work in every arm), "
        f"`x_reference` its multiple of {reference['label']}'s. `calls`: model calls per rollout (title and "
        "other side calls included).",
        "",
        harness_bench_frame(metrics).to_markdown(index=False),
        "",
        source_line(metrics, "bench_harnesses"),
    ]
    return "\n".join(lines) + "\n"


def write_harness_bench_tables(runs: list[dict[str, Any]], results: Path) -> list[Path]:
    """``results/bench_harnesses.md`` (the newest run) and ``.csv``."""
    return write_newest_table(runs, results, "bench_harnesses", harness_bench_markdown, harness_bench_frame)

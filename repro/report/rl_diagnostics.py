"""RL diagnostics per step (what :func:`repro.rl.steps.step_diagnostics` recorded): the rows of every step, a
one-line summary per run, and the ``<table>_diagnostics.md`` / ``.csv`` / ``.svg`` files beside a table of the
miniature or of a loop comparison."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pandas as pd

from repro.report.cells import calls_summary, run_name
from repro.report.table_files import by_table

DIAGNOSTICS_NOTE = (
    "reward_mean: share of resolved rollouts; mixed_group_share: groups (one task's samples) with both outcomes, "
    "the only ones GRPO learns from; clip_fraction: sampled tokens whose ratio was clipped in the updates after "
    "the first; entropy: mean entropy (nats) of the sampling policy on its sampled tokens; calls_per_rollout: "
    "model calls per rollout; log_ratio_first_max: max |log ratio| between the trainer's and the recorded "
    "sampling logprobs before the step's first update (the on-policy check, bounded by "
    "trainer.on_policy_log_ratio_max); log_ratio_max: the same over all updates of the step.")


def merged_histogram(histograms: list[dict[str, int]]) -> dict[str, int]:
    """Calls-per-rollout histograms added up, by number of calls."""
    out: dict[str, int] = {}
    for histogram in histograms:
        for n, c in histogram.items():
            out[n] = out.get(n, 0) + c
    return dict(sorted(out.items(), key=lambda item: int(item[0])))


def diagnostics_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Per RL step: what :func:`repro.rl.steps.step_diagnostics` recorded, with the run and seed."""
    steps = run.get("diagnostics") or [h.get("diagnostics") for h in run["rl"].get("history", [])]
    name = run.get("name") or run_name(run.get("run_dir", ""))
    return [{"run": name, "seed": run.get("seed", ""), **d} for d in steps if d]


def diagnostics_summary(runs: list[dict[str, Any]]) -> pd.DataFrame:
    """One line per run: reward first -> last step, mean mixed-group share and clip fraction, entropy first ->
    last, mean calls per rollout, and the largest first-update |log ratio| (the on-policy check)."""
    lines = []
    for run in runs:
        steps = diagnostics_rows(run)
        if not steps:
            continue
        lines.append({
            "run": steps[0]["run"], "seed": steps[0]["seed"], "steps": len(steps),
            "reward first -> last": f"{steps[0]['reward_mean']:.3f} -> {steps[-1]['reward_mean']:.3f}",
            "mixed groups": f"{statistics.fmean(s['mixed_group_share'] for s in steps):.0%}",
            "clip fraction": f"{statistics.fmean(s['clip_fraction'] for s in steps):.2%}",
            "entropy first -> last": f"{steps[0]['entropy']:.3f} -> {steps[-1]['entropy']:.3f}",
            "calls per rollout": _rl_calls(steps),
            "max first-update abs log ratio": f"{max(s['log_ratio_first_max'] for s in steps):.1e}",
        })
    return pd.DataFrame(lines)


def _rl_calls(steps: list[dict[str, Any]]) -> str:
    """Calls per RL rollout over all steps, with the distribution when the steps recorded it."""
    histogram = merged_histogram([s.get("calls_histogram") or {} for s in steps])
    if not histogram:
        return f"{statistics.fmean(s['calls_per_rollout'] for s in steps):.2f}"
    total = sum(histogram.values())
    shares = ", ".join(f"{n}: {c / total:.0%}" for n, c in histogram.items())
    return f"{calls_summary(histogram)}; {shares}"


def write_diagnostics(runs: list[dict[str, Any]], results: Path) -> list[Path]:
    """``results/<table>_diagnostics.md`` and ``.csv`` per table name (runs without diagnostics are left out)."""
    from repro.report.table_plots import diagnostics_link_line, image_link, table_plot

    written = []
    for name, group in by_table(runs).items():
        frame = pd.DataFrame([r for run in group for r in diagnostics_rows(run)])
        if frame.empty:
            continue
        md, csv = results / f"{name}_diagnostics.md", results / f"{name}_diagnostics.csv"
        frame.to_csv(csv, index=False)
        svg, alt = table_plot(csv)  # the plot of the CSV's rows
        link = image_link(svg, alt)
        md.write_text(f"# {name}: RL diagnostics per step\n\n" + DIAGNOSTICS_NOTE + "\n\n" + link + "\n\n"
                      + frame.to_markdown(index=False, floatfmt=".4g") + "\n")
        table_md = results / f"{name}.md"
        if table_md.exists():
            table_md.write_text(table_md.read_text() + f"\n{diagnostics_link_line(link, md)}\n")
        written += [md, csv, svg]
    return written

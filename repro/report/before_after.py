"""Tables of ``before_after`` runs (the miniature reproduction): Pass@1 before and after RL on the same frozen spec,
the paired difference with its interval and tests, and hours per phase.

One table per ``table`` name (default: the experiment), one row per run, oldest first; rows whose evaluation
fingerprints differ are flagged, because their numbers are not comparable.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

PHASES = ("setup", "warm_start_demos", "warm_start_sft", "eval_before", "rl_rollouts", "rl_training", "eval_after")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _pass_cell(ev: dict[str, Any]) -> str:
    return f"{_pct(ev['pass_at_1'])} [{_pct(ev['ci']['low'])}, {_pct(ev['ci']['high'])}]"


def _phase_hours(run: dict[str, Any]) -> str:
    phases = run.get("compute", {}).get("phases", {})
    parts = [f"{name.replace('warm_start_', 'ws_')} {phases[name]['wall_s'] / 3600:.3f}" for name in PHASES
             if name in phases]
    return ", ".join(parts) or "-"


def _warm_cell(run: dict[str, Any]) -> str:
    warm = run.get("warm_start", {})
    how = "cached" if warm.get("cached") else f"{warm.get('demo_rollouts', '?')} demos"
    return f"{warm.get('key', '?')[:8]} ({how})"


def _rl_cell(run: dict[str, Any]) -> str:
    """steps x tasks x samples, learning rate."""
    rl, trainer = run["rl"]["config"], run.get("trainer", {})
    return (f"{rl.get('steps')}x{rl.get('tasks_per_step')}x{rl.get('samples_per_task')}, "
            f"lr {trainer.get('learning_rate', '?'):g}")


def row(run: dict[str, Any]) -> dict[str, Any]:
    paired, total = run["paired"], run.get("compute", {}).get("total", {})
    return {
        "run": Path(run.get("run_dir", "")).name, "loop": run.get("loop", "proxy"),
        "weighting": run["samples"]["weighting"],
        "samples": run["samples"]["mode"], "seed": run["rl"]["config"].get("seed", ""), "RL": _rl_cell(run),
        "n": paired["n"], "Pass@1 before": _pass_cell(run["before"]), "Pass@1 after": _pass_cell(run["after"]),
        "delta [95% CI]": f"{100 * paired['delta']:+.1f} [{100 * paired['delta_low']:+.1f}, "
                          f"{100 * paired['delta_high']:+.1f}]",
        "sign-flip p": _p(paired.get("sign_flip_p")), "McNemar p (sample 0)": f"{paired['mcnemar_p']:.3g}",
        "wall h": f"{run.get('wall_s', 0) / 3600:.2f}", "hours per phase (wall)": _phase_hours(run),
        "CPU core-h": f"{total.get('cpu_core_h', 0):.2f}", "GPU h": f"{total.get('gpu_h_allocated', 0):.2f}",
        "warm start": _warm_cell(run), "fingerprint": run["fingerprint"][:8],
    }


def run_markdown(runs: list[dict[str, Any]]) -> str:
    """The markdown table for ``runs`` (all of one table), with a note on how to rebuild it."""
    frame = pd.DataFrame([row(r) for r in runs])
    lines = [frame.to_markdown(index=False), ""]
    fingerprints = {r["fingerprint"] for r in runs}
    if len(fingerprints) > 1:
        lines.append(f"**Warning**: {len(fingerprints)} different evaluation fingerprints; rows are not comparable.")
    first = runs[0]
    lines.append(f"Held-out tasks: `{first['task_distribution']}`; train tasks: `{first['train_tasks']}`. "
                 f"Pass@1 = mean over k={first['before'].get('k', 1)} samples per task at temperature "
                 f"{first.get('eval_temperature', '?')}, 95% Wilson intervals; delta = paired mean difference over "
                 "instances (bootstrap interval); sign-flip = paired randomization test on per-instance means; "
                 "McNemar = exact test on solved/unsolved pairs of sample 0.")
    return "\n".join(lines) + "\n"


def write_named_tables(runs: list[dict[str, Any]], results: Path, markdown: Callable[[list[dict[str, Any]]], str],
                       csv_rows: Callable[[dict[str, Any]], list[dict[str, Any]]]) -> list[Path]:
    """``results/<table>.md`` (``markdown`` of the table's runs) and ``.csv`` (``csv_rows`` of each run), per table
    name (a run's ``table``, else its experiment)."""
    by_table: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_table.setdefault(run.get("table") or run["experiment"], []).append(run)
    written = []
    for name, rows in by_table.items():
        md, csv = results / f"{name}.md", results / f"{name}.csv"
        md.write_text(f"# {name}\n\n" + markdown(rows))
        pd.DataFrame([r for run in rows for r in csv_rows(run)]).to_csv(csv, index=False)
        written += [md, csv]
    return written


def write_before_after_tables(runs: list[dict[str, Any]], results: Path) -> list[Path]:
    """``results/<table>.md`` and ``.csv`` per table name."""
    return write_named_tables(runs, results, run_markdown, lambda run: [row(run)])

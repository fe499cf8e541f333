"""Result tables of evaluation runs (metrics.json of kind "eval"): one row per (experiment, fingerprint).

Runs are grouped into tables by their ``table`` field (default: the experiment name). Only rows that share an
evaluation fingerprint are one comparison; when a table mixes fingerprints the markdown says so in a visible
warning above the rows — naming the fingerprints and the spec fields that differ — and the CSV carries the same
warning in a column. Of several runs with the same (experiment, fingerprint) the newest is shown.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from repro.evaluation.spec import fingerprint_of
from repro.report.cells import pct
from repro.report.sweep_table import write_sweep_table
from repro.report.table_files import by_table, table_file_stem

_SHORT = 8


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def spec_differences(specs: list[Mapping[str, Any]]) -> list[str]:
    """Dotted spec fields whose values are not the same in all ``specs``."""
    flat = [_flatten(s) for s in specs]
    keys = sorted(set().union(*flat)) if flat else []
    return [k for k in keys if len({repr(f.get(k)) for f in flat}) > 1]


def select_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Newest run per (experiment, fingerprint), in first-seen order; adds ``runs`` (how many were found)."""
    chosen: dict[tuple[str, str], dict[str, Any]] = {}
    counts: dict[tuple[str, str], int] = {}
    for run in sorted(runs, key=lambda r: r.get("started_at", 0)):
        key = (run["experiment"], run["fingerprint"])
        counts[key] = counts.get(key, 0) + 1
        chosen[key] = run
    return [{**run, "runs": counts[key]} for key, run in chosen.items()]


def _n_cell(row: dict[str, Any]) -> str:
    n = str(row["n_tasks"])
    if row["n_tasks"] != row.get("n_tasks_total", row["n_tasks"]):
        n += f" of {row['n_tasks_total']}"
    return n if row.get("complete", True) else n + " (incomplete)"


def _pass_at_k_cell(row: dict[str, Any]) -> str:
    values = {int(k): v for k, v in row.get("pass_at_k", {}).items() if int(k) > 1}
    return ", ".join(f"@{k} {pct(v)}" for k, v in sorted(values.items())) or "-"


def csv_frame(rows: list[dict[str, Any]], warning: str) -> pd.DataFrame:
    """Raw numbers, one row per (experiment, fingerprint)."""
    return pd.DataFrame([{
        "experiment": r["experiment"], "model": r.get("model", ""), "n_tasks": r["n_tasks"],
        "n_tasks_total": r.get("n_tasks_total"), "k": r.get("k", 1), "pass_at_1": r["pass_at_1"],
        "ci_method": r["ci"]["method"], "ci_low": r["ci"]["low"], "ci_high": r["ci"]["high"],
        "strict_pass_at_1": r["strict_pass_at_1"], "infra_failures": r["counts"]["infra_failures"],
        "cpu_h": r["cost"]["cpu_h_total"], "gpu_h": r["cost"]["gpu_h_total"], "harness": r["harness"],
        "task_distribution": r["task_distribution"], "fingerprint": r["fingerprint"], "complete": r.get("complete"),
        "runs": r["runs"], "run_dir": r.get("run_dir", ""), "warning": warning,
    } for r in rows])


def markdown_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Formatted cells for the published table."""
    return pd.DataFrame([{
        "experiment": r["experiment"], "model": r.get("model", ""), "n": _n_cell(r), "Pass@1": pct(r["pass_at_1"]),
        f"{round(100 * r['ci']['confidence'])}% CI ({r['ci']['method']})":
            f"[{pct(r['ci']['low'])}, {pct(r['ci']['high'])}]",
        "strict Pass@1": pct(r["strict_pass_at_1"]), "pass@k": _pass_at_k_cell(r),
        "infra failures": r["counts"]["infra_failures"], "CPU-h": f"{r['cost']['cpu_h_total']:.2f}",
        "GPU-h": f"{r['cost']['gpu_h_total']:.2f}", "harness": r["harness"], "tasks": r["task_distribution"],
        "fingerprint": r["fingerprint"][:_SHORT],
    } for r in rows])


def warnings_for(rows: list[dict[str, Any]]) -> list[str]:
    """Visible warnings: mixed fingerprints, an experiment under several specs, incomplete runs, bad fingerprints."""
    out = []
    fingerprints = sorted({r["fingerprint"] for r in rows})
    if len(fingerprints) > 1:
        differ = spec_differences([r["spec"] for r in rows])
        out.append(f"**NOT ONE COMPARISON**: these rows were evaluated under {len(fingerprints)} different "
                   f"evaluation specs (fingerprints {', '.join(f[:_SHORT] for f in fingerprints)}); only rows with "
                   f"the same fingerprint are comparable. The specs differ in: {', '.join(differ) or '?'}.")
    for name in sorted({r["experiment"] for r in rows}):
        own = sorted({r["fingerprint"][:_SHORT] for r in rows if r["experiment"] == name})
        if len(own) > 1:
            out.append(f"Experiment `{name}` was run under {len(own)} different specs ({', '.join(own)}): "
                       "its rows are separate results, not repeats of one.")
    out += [f"`{r['experiment']}` ({r['fingerprint'][:_SHORT]}) is incomplete: "
            f"{len(r.get('missing_samples', []))} samples have no result." for r in rows if not r.get("complete", True)]
    out += [f"`{r['experiment']}`: fingerprint {r['fingerprint'][:_SHORT]} does not match its recorded spec "
            f"({fingerprint_of(r['spec'])[:_SHORT]}); the metrics.json was edited or is corrupt."
            for r in rows if fingerprint_of(r["spec"]) != r["fingerprint"]]
    return out


def eval_markdown(name: str, rows: list[dict[str, Any]]) -> str:
    lines = [f"# {name}", ""]
    lines += [f"> WARNING: {w}" + "\n" for w in warnings_for(rows)]
    lines += [
        "Pass@1 = mean over tasks of the per-task pass@1; infrastructure failures (grader error/timeout, crashed "
        "harness) are left out of the denominator and counted apart; strict Pass@1 counts them as failures. "
        "n = tasks in the denominator. Fingerprint = the frozen evaluation spec (harness, tasks, sampling, limits, "
        "sandbox, k, seeds); rows are comparable only when it matches.",
        "",
        markdown_frame(rows).to_markdown(index=False, disable_numparse=True),
        "",
        "Sources: " + ", ".join(f"`{r.get('run_dir', '?')}`" for r in rows) + " · built by `repro table`.",
    ]
    return "\n".join(lines) + "\n"


def run_markdown(metrics: dict[str, Any]) -> str:
    """The table of a single run's metrics (what a job prints when it ends)."""
    return eval_markdown(metrics.get("table") or metrics["experiment"], select_rows([metrics]))


def write_eval_tables(runs: list[dict[str, Any]], results: Path) -> list[Path]:
    """One ``<table>.md`` and ``<table>.csv`` per table name among ``runs`` (a harness x task matrix when its newest
    run asks for ``layout: matrix``); returns the files written."""
    from repro.report.table_plots import image_link, table_plot

    written = []
    for name, table_runs in sorted(by_table(runs).items()):
        if table_runs[-1].get("layout") == "matrix":
            written += write_sweep_table(name, table_runs, results)
            continue
        rows = select_rows(table_runs)
        stem = table_file_stem(name)
        md, csv = results / f"{stem}.md", results / f"{stem}.csv"
        frame = csv_frame(rows, " | ".join(warnings_for(rows)))
        frame.to_csv(csv, index=False)
        svg, alt = table_plot(csv)  # the plot of the CSV's rows
        md.write_text(eval_markdown(name, rows) + f"\n{image_link(svg, alt)}\n")
        written += [md, csv, svg]
    return written

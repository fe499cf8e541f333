"""The harness x task-distribution matrix of a sweep (eval runs with ``layout: matrix``).

One matrix per evaluated model (the checkpoint a run loaded), the most recently evaluated first; in it one cell per
(harness@version, task distribution): its newest run. Every cell has its own frozen fingerprint (the harness is part
of the spec), so the cells are separate evaluations of one model; the table warns when a cell is incomplete."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from repro.report.cells import mean_cell, pct
from repro.report.family_sections import split_by_family
from repro.report.table_files import table_file_stem

_SHORT = 8



def model_of(run: dict[str, Any]) -> str:
    """The model a run evaluated: the checkpoint it loaded (``eval.checkpoint`` of its config, repository-relative
    in a record), else the model's name (the untrained tiny model)."""
    checkpoint = ((run.get("run_config") or {}).get("eval") or {}).get("checkpoint")
    return str(checkpoint or run.get("model", ""))


def by_model(runs: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(model, its runs) per evaluated model, the most recently evaluated model first."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault(model_of(run), []).append(run)
    return sorted(groups.items(), key=lambda item: -max(r.get("started_at", 0) for r in item[1]))


def newest_cells(runs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(harness, task distribution) -> its newest run (the runs of one model)."""
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for run in sorted(runs, key=lambda r: r.get("started_at", 0)):
        cells[(run["harness"], run["task_distribution"])] = run
    return cells


def cell_text(run: dict[str, Any]) -> str:
    """``44.0% [34.7, 53.8] n=50`` (+ infra failures, incomplete)."""
    ci = run["ci"]
    text = f"{pct(run['pass_at_1'])} [{pct(ci['low']).rstrip('%')}, {pct(ci['high'])}] n={run['n_tasks']}"
    if run["counts"]["infra_failures"]:
        text += f", {run['counts']['infra_failures']} infra failures"
    return text if run.get("complete", True) else text + " (incomplete)"


def matrix_frame(cells: dict[tuple[str, str], dict[str, Any]]) -> pd.DataFrame:
    """Rows: harness@version; columns: task distributions; "-" where the sweep has no run."""
    harnesses = sorted({h for h, _ in cells})
    tasks = sorted({t for _, t in cells})
    rows = [{"harness": h, **{t: cell_text(cells[(h, t)]) if (h, t) in cells else "-" for t in tasks}}
            for h in harnesses]
    return pd.DataFrame(rows, columns=["harness", *tasks])


def family_matrix(cells: dict[tuple[str, str], dict[str, Any]]) -> pd.DataFrame:
    """Rows: harness@version x task family (the mutation operator of a bundled task; the repository of a SWE-bench
    row); columns: task distributions; cell: Pass@1 over the family's tasks with its bootstrap interval and count."""
    by_row: dict[tuple[str, str], dict[str, str]] = {}
    for (harness, tasks), run in sorted(cells.items()):
        for family, values in split_by_family(run.get("per_task") or {}).items():
            by_row.setdefault((harness, family), {})[tasks] = f"{mean_cell(values)} n={len(values)}"
    columns = sorted({t for _, t in cells})
    return pd.DataFrame([{"harness": h, "family": f, **{t: row.get(t, "-") for t in columns}}
                         for (h, f), row in by_row.items()], columns=["harness", "family", *columns])


def cells_frame(cells: dict[tuple[str, str], dict[str, Any]]) -> pd.DataFrame:
    """One row per cell with its numbers and provenance (also the CSV)."""
    return pd.DataFrame([{
        "harness": h, "tasks": t, "model": model_of(r), "n_tasks": r["n_tasks"], "k": r.get("k", 1),
        "pass_at_1": r["pass_at_1"], "ci_low": r["ci"]["low"], "ci_high": r["ci"]["high"],
        "ci_method": r["ci"]["method"], "strict_pass_at_1": r["strict_pass_at_1"],
        "infra_failures": r["counts"]["infra_failures"], "cpu_h": r["cost"]["cpu_h_total"],
        "gpu_h": r["cost"]["gpu_h_total"], "wall_s": round(r.get("finished_at", 0) - r.get("started_at", 0)),
        "fingerprint": r["fingerprint"][:_SHORT], "run_dir": r.get("run_dir", ""),
    } for (h, t), r in sorted(cells.items())])


def _formatted(frame: pd.DataFrame) -> pd.DataFrame:
    """Floats as 3-decimal strings (so a numeric-looking fingerprint stays text in the markdown)."""
    return frame.apply(lambda col: col.map(lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)))


def sweep_warnings(cells: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    return [f"{h} on {t} is incomplete." for (h, t), r in sorted(cells.items()) if not r.get("complete", True)]


def sweep_commands(runs: list[dict[str, Any]]) -> list[str]:
    """One ``repro run -m k=v1,v2 ...`` per sweep directory, rebuilt from its cells' overrides (``overrides``, as a
    run record holds them, else the run directory's ``overrides.txt``)."""
    by_sweep: dict[Path, dict[str, list[str]]] = {}
    for run in runs:
        path = Path(run.get("run_dir", "")) / "overrides.txt"
        if "overrides" not in run and not path.is_file():
            continue
        values = by_sweep.setdefault(path.parent.parent, {})
        for line in run["overrides"] if "overrides" in run else path.read_text().splitlines():
            key, sep, value = line.strip().partition("=")
            if sep and value not in values.setdefault(key, []):
                values[key].append(value)
    return ["repro run -m " + " ".join(f"{k}={','.join(v)}" for k, v in values.items())
            for _, values in sorted(by_sweep.items())]


INTRO = ("One model under frozen evaluation in each harness version x task distribution; a matrix per model, the "
         "most recently evaluated first. Cell: Pass@1 (mean over tasks of the per-task mean over k samples) with its "
         "95% interval and the number of tasks in the denominator; infrastructure failures (crashed harness, grader "
         "error/timeout) are left out of the denominator and counted in the cell. Each cell is its own frozen spec "
         "(fingerprint below).")


FAMILY_NOTE = ("Family: the mutation operator of a bundled task (for SWE-bench rows, the repository); Pass@1 over "
               "the family's tasks (mean of the per-task solved share) with its 95% bootstrap interval over tasks.")


def model_section(model: str, runs: list[dict[str, Any]], level: str) -> list[str]:
    """One model's matrix, its cells with their numbers, the commands and the sources."""
    cells = newest_cells(runs)
    lines = [f"{level} `{model}`", "", *(f"> WARNING: {w}\n" for w in sweep_warnings(cells)),
             matrix_frame(cells).to_markdown(index=False, disable_numparse=True), "",
             f"{level}# By task family", "",
             family_matrix(cells).to_markdown(index=False, disable_numparse=True), "",
             FAMILY_NOTE, "",
             f"{level}# Cells of `{model}`", "",
             _formatted(cells_frame(cells).drop(columns=["run_dir", "model"])).to_markdown(
                 index=False, disable_numparse=True), ""]
    sources = ", ".join(f"`{r.get('run_dir', '?')}`" for _, r in sorted(cells.items()))
    return [*lines, *(f"Command: `{c}`  " for c in sweep_commands(list(cells.values()))), "",
            f"Sources: {sources} · built by `repro table`.", ""]


def sweep_markdown(name: str, runs: list[dict[str, Any]]) -> str:
    lines = [f"# {name}", "", INTRO, ""]
    for i, (model, group) in enumerate(by_model(runs)):
        if i == 1:
            lines += ["## Earlier models", ""]
        lines += model_section(model, group, "##" if i == 0 else "###")
    return "\n".join(lines).rstrip("\n") + "\n"


def sweep_cells_frame(runs: list[dict[str, Any]]) -> pd.DataFrame:
    """Every model's cells, the most recently evaluated model last (its heatmap is the one drawn)."""
    return pd.concat([cells_frame(newest_cells(group)) for _, group in reversed(by_model(runs))], ignore_index=True)


def write_sweep_table(name: str, runs: list[dict[str, Any]], results: Path) -> list[Path]:
    from repro.report.table_plots import image_link, table_plot

    stem = table_file_stem(name)
    md, csv = results / f"{stem}.md", results / f"{stem}.csv"
    sweep_cells_frame(runs).to_csv(csv, index=False)
    svg, alt = table_plot(csv)  # the plot of the CSV's cells
    md.write_text(sweep_markdown(name, runs) + f"\n{image_link(svg, alt)}\n")
    return [md, csv, svg]


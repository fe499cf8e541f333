"""The harness x task-distribution matrix of a sweep (eval runs with ``layout: matrix``).

One cell per (harness@version, task distribution): its newest run. Every cell has its own frozen fingerprint
(the harness is part of the spec), so the cells are separate evaluations of one model; the table warns when the
cells evaluated different models or a cell is incomplete."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from repro.report.cells import pct
from repro.report.table_files import table_file_stem

_SHORT = 8



def newest_cells(runs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(harness, task distribution) -> its newest run."""
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


def cells_frame(cells: dict[tuple[str, str], dict[str, Any]]) -> pd.DataFrame:
    """One row per cell with its numbers and provenance (also the CSV)."""
    return pd.DataFrame([{
        "harness": h, "tasks": t, "model": r.get("model", ""), "n_tasks": r["n_tasks"], "k": r.get("k", 1),
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
    models = sorted({r.get("model", "") for r in cells.values()})
    out = [f"**NOT ONE MODEL**: the cells evaluated {len(models)} models ({', '.join(models)})."] if len(models) > 1 \
        else []
    out += [f"{h} on {t} is incomplete." for (h, t), r in sorted(cells.items()) if not r.get("complete", True)]
    return out


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


def sweep_markdown(name: str, runs: list[dict[str, Any]]) -> str:
    cells = newest_cells(runs)
    models = sorted({r.get("model", "") for r in cells.values()})
    commands = sweep_commands(list(cells.values()))
    lines = [f"# {name}", ""]
    lines += [f"> WARNING: {w}\n" for w in sweep_warnings(cells)]
    lines += [
        f"One model (`{', '.join(models)}`) under frozen evaluation in each harness version x task distribution. "
        "Cell: Pass@1 (mean over tasks of the per-task mean over k samples) with its 95% interval and the number of "
        "tasks in the denominator; infrastructure failures (crashed harness, grader error/timeout) are left out of "
        "the denominator and counted in the cell. Each cell is its own frozen spec (fingerprint below).",
        "",
        matrix_frame(cells).to_markdown(index=False, disable_numparse=True),
        "",
        "## Cells",
        "",
        _formatted(cells_frame(cells).drop(columns=["run_dir"])).to_markdown(index=False, disable_numparse=True),
        "",
        "Sources: " + ", ".join(f"`{r.get('run_dir', '?')}`" for _, r in sorted(cells.items()))
        + " · built by `repro table`.",
    ]
    if commands:
        lines[-1:-1] = [*(f"Command: `{c}`" + "  " for c in commands), ""]
    return "\n".join(lines) + "\n"


def write_sweep_table(name: str, runs: list[dict[str, Any]], results: Path) -> list[Path]:
    from repro.report.table_plots import image_link, table_plot

    stem = table_file_stem(name)
    md, csv = results / f"{stem}.md", results / f"{stem}.csv"
    cells_frame(newest_cells(runs)).to_csv(csv, index=False)
    svg, alt = table_plot(csv)  # the plot of the CSV's cells
    md.write_text(sweep_markdown(name, runs) + f"\n{image_link(svg, alt)}\n")
    return [md, csv, svg]


"""The harness x task-distribution matrix of a sweep (eval runs with ``layout: matrix``).

One cell per (harness@version, task distribution): its newest run. Every cell has its own frozen fingerprint
(the harness is part of the spec), so the cells are separate evaluations of one model; the table warns when the
cells evaluated different models or a cell is incomplete. A Hydra callback prints the matrix of a sweep when its
last job ends and writes it beside the runs (``sweep.md``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from repro.report.eval_table import pct, table_file_stem
from repro.report.records import ERROR_FILE

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


def failed_jobs(sweep_dir: Path) -> list[dict[str, Any]]:
    """The ``error.json`` records of the sweep's failed jobs, by job number."""
    records = [json.loads(p.read_text()) for p in sweep_dir.glob(f"*/{ERROR_FILE}")]
    return sorted(records, key=lambda r: r["job"])


def failures_markdown(failed: list[dict[str, Any]]) -> str:
    lines = ["## Failed jobs (no cell)", ""]
    lines += [f"- #{r['job']} `{' '.join(r['overrides'])}`: {r['error']}" for r in failed]
    return "\n".join(lines) + "\n"


class _SweepCallback(Callback):
    """Knows the sweep's directory at its end. ``hydra.sweep.dir`` holds ``${now:...}``, which resolves again (to
    a later time) when read at the end, so the directory is taken from the jobs that ran."""

    def __init__(self) -> None:
        self._seen: set[Path] = set()

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        hydra_cfg = getattr(job_return, "hydra_cfg", None)
        if hydra_cfg is None:
            return
        path = OmegaConf.select(hydra_cfg, "hydra.runtime.output_dir") or \
            OmegaConf.select(hydra_cfg, "runtime.output_dir")
        if path:
            self._seen.add(Path(path).parent)

    def sweep_dir(self, config: DictConfig) -> Path:
        """The sweep directory: the jobs' parent, else the configured one, else the newest sibling sweep."""
        if len(self._seen) == 1:
            return next(iter(self._seen))
        configured = Path(config.hydra.sweep.dir)
        if configured.exists():
            return configured
        sweeps = sorted(configured.parent.glob("*/multirun.yaml"), key=lambda p: p.stat().st_mtime)
        return sweeps[-1].parent if sweeps else configured


class SweepTableCallback(_SweepCallback):
    """At the end of a Hydra multirun: the matrix of this sweep's runs, printed and written to ``sweep.md``;
    failed jobs are listed under it and make the command exit non-zero."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from repro.report.tables import find_metrics

        sweep_dir = self.sweep_dir(config)
        runs = [{**m, "run_dir": m.get("run_dir", str(p.parent))} for p, m in find_metrics(sweep_dir)
                if m.get("kind") == "eval"]
        text = sweep_markdown(runs[-1].get("table") or runs[-1]["experiment"], runs) if runs else \
            f"# sweep {sweep_dir}\n\nNo finished runs (no metrics.json).\n"
        publish_sweep(sweep_dir, text, len(runs))


def publish_sweep(sweep_dir: Path, text: str, finished: int) -> None:
    """Write ``sweep.md`` (with the failed jobs listed) and print it; SystemExit when a job failed."""
    failed = failed_jobs(sweep_dir)
    if failed:
        text += "\n" + failures_markdown(failed)
    (sweep_dir / "sweep.md").write_text(text)
    print(text, flush=True)
    if failed:
        raise SystemExit(f"{len(failed)} of {len(failed) + finished} sweep jobs failed (see {sweep_dir}/sweep.md)")


class SeedsTableCallback(_SweepCallback):
    """At the end of a multirun of the miniature (``seed=0,1,2``): the table of this sweep's runs, one row per seed
    and the pooled row, printed and written to ``sweep.md``; failed jobs are listed and make the exit non-zero."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from repro.report.before_after import run_markdown
        from repro.report.loop_comparison import comparison_markdown
        from repro.report.tables import find_metrics

        sweep_dir = self.sweep_dir(config)
        found = [{**m, "run_dir": m.get("run_dir", str(p.parent))} for p, m in find_metrics(sweep_dir)]
        before_after = [m for m in found if m.get("kind") == "before_after"]
        comparisons = [m for m in found if m.get("kind") == "loop_comparison"]
        parts = [f"# sweep {sweep_dir.name}", ""]
        if before_after:
            parts.append(run_markdown(before_after))
        if comparisons:
            parts.append(comparison_markdown(comparisons))
        if not before_after and not comparisons:
            parts.append("No finished runs (no metrics.json).\n")
        publish_sweep(sweep_dir, "\n".join(parts), len(found))

"""`repro report RUN_DIR [RUN_DIR ...] --out DIR`: a static HTML report of runs (one folder; open ``index.html``
from disk, no server, nothing fetched), built only from what the run directories hold.

``index.html``: the runs' table rows (the row builders of `repro table`), the comparison of the runs (refused, with
the reason, when their frozen-evaluation fingerprints differ), plots (``plots/*.svg``, :mod:`repro.report.plots`),
a failed and a solved rollout of one task side by side and the list of tasks; ``tasks/<task>.html`` the pair of
each task; ``rollouts/<rollout>.html`` one rollout's turns, verdict, calls and calls -> rows.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from repro.evaluation.paired import paired_summary
from repro.report import before_after, eval_table, loop_comparison_table, plots
from repro.report.cells import paired_cells
from repro.report.family_sections import family_frame
from repro.report.html import esc, page, pre, table, tag
from repro.report.rl_diagnostics import diagnostics_rows, diagnostics_summary, merged_histogram
from repro.report.run_data import Run, Sample, expand, load_run, samples_of
from repro.report.sweep_table import cells_frame, matrix_frame, newest_cells
from repro.report.trajectories import TaskSamples, by_task, file_stem, rollout_body, side_by_side
from repro.train.samples import SampleConfig


@dataclass
class Report:
    index: Path
    refused: str | None  # why the runs were not compared (differing fingerprints); None: compared or one run
    pages: int


def refusal(groups: list[list[Run]]) -> str | None:
    """Why the runs of different arguments cannot be compared: their frozen-evaluation fingerprints differ (or
    one has none). None when there is a single argument (a run, or a sweep whose cells are separate specs)."""
    if len(groups) < 2:
        return None
    prints = [sorted({r.fingerprint or "none" for r in group}) for group in groups]
    if all(p == prints[0] for p in prints) and "none" not in prints[0]:
        return None
    names = "; ".join(f"{', '.join(r.label for r in g)}: {', '.join(p[:8] for p in ps)}"
                      for g, ps in zip(groups, prints, strict=True))
    specs = [r.spec for g in groups for r in g if r.spec]
    differ = eval_table.spec_differences(specs) if len(specs) > 1 else []
    why = f" The specs differ in: {', '.join(differ)}." if differ else \
        " A run without a fingerprint has no metrics.json (it did not finish)." if "none" in str(prints) else ""
    return (f"refusing to compare these runs: their frozen-evaluation fingerprints differ ({names}); their numbers "
            f"are not comparable.{why}")


def rows_section(runs: list[Run]) -> str:
    """Each kind's rows by its `repro table` builder (one table for all runs of a kind)."""
    parts = []
    by_kind: dict[str, list[Run]] = {}
    for run in runs:
        by_kind.setdefault(run.kind, []).append(run)
    for kind, group in by_kind.items():
        metrics = [r.metrics for r in group if r.metrics]
        parts.append(tag("h3", esc(f"{kind} ({len(group)} run{'s' if len(group) > 1 else ''})")))
        parts.append(kind_rows(kind, metrics) if metrics else
                     tag("p", esc("no metrics.json: these runs did not finish (" + ", ".join(r.label for r in group)
                                  + ")"), class_="muted"))
    return "".join(parts)


def families_block(sections: list[Any]) -> str:
    """The "What changed, by task family" table of a kind's runs ("" without per-instance outcomes)."""
    return tag("div", "What changed, by task family", class_="label") + table(family_frame(sections)) \
        if sections else ""


def kind_rows(kind: str, metrics: list[dict[str, Any]]) -> str:
    if kind == "eval":
        if metrics[-1].get("layout") == "matrix":
            cells = newest_cells(metrics)
            return table(matrix_frame(cells)) + table(cells_frame(cells).drop(columns=["run_dir"]))
        rows = eval_table.select_rows(metrics)
        warnings = "".join(tag("div", esc(w.replace("**", "")), class_="banner warn")
                           for w in eval_table.warnings_for(rows))
        return warnings + table(eval_table.markdown_frame(rows))
    if kind == "before_after":
        summary = diagnostics_summary(metrics)
        return table(pd.DataFrame(before_after.table_rows(metrics))) + families_block(
            before_after.all_family_sections(metrics)) + (
            tag("div", "RL diagnostics per run", class_="label") + table(summary) if len(summary) else "")
    if kind == "loop_comparison":
        return table(pd.DataFrame(loop_comparison_table.table_rows(metrics)).fillna("")) + families_block(
            loop_comparison_table.all_family_sections(metrics))
    return tag("p", esc(f"no table for runs of kind {kind!r}"), class_="muted")


def final_per_instance(metrics: dict[str, Any]) -> dict[str, float] | None:
    """Per-instance solved share of a run's final evaluation (eval: the run; before/after: after RL)."""
    if metrics.get("kind") == "eval":
        return metrics.get("per_task")
    return (metrics.get("per_instance") or {}).get("after")


def comparison_section(runs: list[Run]) -> str:
    """Each run against the first, paired over the instances both evaluated (final evaluations)."""
    base = runs[0]
    rows = []
    for other in runs[1:]:
        a, b = final_per_instance(base.metrics or {}), final_per_instance(other.metrics or {})
        if not a or not b or not set(a) & set(b):
            continue
        paired = paired_summary(a, b)
        rows.append({"comparison": f"{other.label} - {base.label}", "n": paired["n"], **paired_cells(paired)})
    if not rows:
        return ""
    return (tag("h2", "Comparison", id_="comparison") + table(rows) +
            tag("p", "Paired over instances: per-instance solved share of each run's final evaluation (after RL for "
                     "a before/after run); bootstrap interval in points, sign-flip p, minimum detectable effect in "
                     "points (alpha 0.05, power 0.8). Same frozen-evaluation fingerprint, so comparable.",
                class_="note"))


def _diagnostics_frame(runs: list[Run]) -> pd.DataFrame:
    rows = []
    for run in runs:
        steps = run.diagnostics or (diagnostics_rows(run.metrics) if run.kind == "before_after" else [])
        rows += [{**s, "run": run.label} for s in steps]
    return pd.DataFrame(rows)


def plot_files(runs: list[Run], comparable: bool, folder: Path) -> list[tuple[str, str, bool]]:
    """The plots of these runs under ``folder``: (file name, caption, full width)."""
    folder.mkdir(parents=True, exist_ok=True)
    made: list[tuple[str, str, bool]] = []

    def save(name: str, fig: Any, caption: str, wide: bool = False) -> None:
        plots.save_svg(fig, folder / name)
        made.append((name, caption, wide))

    diagnostics = _diagnostics_frame(runs)
    if len(diagnostics):
        save("rl_diagnostics.svg", plots.rl_diagnostics(diagnostics), "RL diagnostics per step (rl/diagnostics.jsonl)",
             wide=True)
    finished = [r for r in runs if r.metrics]
    curves, histograms = {}, {}
    for run in finished:
        m = run.metrics or {}
        evaluations = {"before": m["before"], "after": m["after"]} if m.get("kind") == "before_after" else \
            {"": m} if m.get("kind") == "eval" else {}
        for name, ev in evaluations.items():
            label = f"{run.label} {name}".strip() if len(finished) > 1 or not name else name
            if ev.get("pass_at_k"):
                curves[label] = ev["pass_at_k"]
            if ev.get("calls_histogram"):
                histograms[label] = ev["calls_histogram"]
    rl_calls = merged_histogram([s.get("calls_histogram") or {} for s in diagnostics.to_dict("records")]) \
        if "calls_histogram" in diagnostics else {}
    if rl_calls:
        histograms["RL rollouts"] = rl_calls
    before_after = [r for r in finished if r.kind == "before_after"]
    if len(before_after) == 1:
        m = before_after[0].metrics or {}
        save("before_after.svg", plots.before_after_outcomes(m["per_instance"]["before"], m["per_instance"]["after"]),
             "per-instance outcomes before and after RL")
    elif comparable and len(finished) == 2 and all(final_per_instance(r.metrics or {}) for r in finished):
        a, b = finished
        save("before_after.svg", plots.before_after_outcomes(final_per_instance(a.metrics or {}) or {},
                                                             final_per_instance(b.metrics or {}) or {},
                                                             (a.label, b.label)), "per-instance outcomes, run vs run")
    if any(len(curve) > 1 for curve in curves.values()):  # k = 1 alone is Pass@1, in the table
        save("pass_at_k.svg", plots.pass_at_k(curves), "pass@k (unbiased estimator over the k samples)")
    if histograms:
        save("calls_per_rollout.svg", plots.calls_histogram(histograms), "model calls per rollout")
    matrix = [r.metrics for r in finished if r.kind == "eval" and (r.metrics or {}).get("layout") == "matrix"]
    if matrix:
        save("sweep_matrix.svg", plots.sweep_heatmap(cells_frame(newest_cells(matrix))), "sweep: harness x tasks")
    return made


def plots_section(made: list[tuple[str, str, bool]]) -> str:
    if not made:
        return tag("p", "(nothing to plot: no finished run with metrics)", class_="muted")
    figures = [tag("figure", tag("img", "", src=f"plots/{name}", alt=caption) + tag("figcaption", esc(caption)),
                   class_="wide" if wide else None) for name, caption, wide in made]
    return tag("div", "".join(figures), class_="plots")


def sample_config(run: Run) -> SampleConfig:
    """How the run built rows (its config.yaml's ``samples`` and ``trainer.weighting``), else the defaults."""
    config = yaml.safe_load(run.config_text) if run.config_text else {}
    given = {**(config.get("samples") or {}), "weighting": (config.get("trainer") or {}).get("weighting",
                                                                                            SampleConfig.weighting)}
    known = {f.name for f in fields(SampleConfig)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items() if k in known and v is not None}
    return SampleConfig(**values)


def runs_section(runs: list[Run]) -> str:
    parts = []
    for run in runs:
        facts = f"{run.path} · kind {run.kind} · fingerprint {run.fingerprint or '-'}"
        body = tag("p", esc(facts))
        if run.overrides:
            body += tag("p", "overrides: " + tag("code", esc(" ".join(run.overrides))))
        if run.config_text:
            body += tag("details", tag("summary", "config.yaml (resolved)") + pre(run.config_text))
        error = run.path / "error.json"
        if error.exists():
            body += tag("div", esc("error.json: " + error.read_text()[:2000]), class_="banner refused")
        parts.append(tag("h3", esc(run.label)) + body)
    return "".join(parts)


def _tasks_table(tasks: list[TaskSamples], task_pages: set[str]) -> str:
    rows = []
    for task in tasks:
        counts = task.counts()
        name = esc(task.instance_id)
        rows.append({"task": tag("a", name, href=f"tasks/{file_stem(task.instance_id)}.html")
                     if task.instance_id in task_pages else name, **counts, "side by side": task.note() or "yes"})
    return table(rows, html_columns=("task",))


def build_report(paths: list[Path], out: Path, max_tasks: int = 40, max_rollouts: int = 200) -> Report:
    """Write the report of the runs at ``paths`` (run directories, or sweep directories) into ``out``."""
    groups = [[load_run(p) for p in expand([path])] for path in paths]
    runs = [r for g in groups for r in g]
    refused = refusal(groups)
    out.mkdir(parents=True, exist_ok=True)
    for sub in ("plots", "tasks", "rollouts"):
        shutil.rmtree(out / sub, ignore_errors=True)
    configs = {r.label: sample_config(r) for r in runs}
    samples = [s for r in runs for s in samples_of(r)]
    tasks = by_task(samples)
    shown = tasks[:max_tasks]
    paired = [s for t in shown for s in t.pair() if s]
    chosen = list(dict.fromkeys([*paired, *(s for t in shown for s in t.samples)]))[:max_rollouts]
    pages = set(chosen)

    def link(sample: Sample, prefix: str = "") -> str | None:
        return f"{prefix}rollouts/{file_stem(sample.report.rollout_id)}.html" if sample in pages else None

    (out / "rollouts").mkdir()
    for sample in chosen:
        body = rollout_body(sample, configs[sample.run])
        (out / "rollouts" / f"{file_stem(sample.report.rollout_id)}.html").write_text(
            page(f"rollout {sample.report.rollout_id}", sample.where, body, [("../index.html", "report")]))
    (out / "tasks").mkdir()
    for task in shown:
        body = side_by_side(task, lambda s: link(s, "../"))
        (out / "tasks" / f"{file_stem(task.instance_id)}.html").write_text(
            page(f"task {task.instance_id}", f"{len(task.samples)} samples", body, [("../index.html", "report")]))
    made = plot_files(runs, refused is None, out / "plots")
    index = out / "index.html"
    index.write_text(page("repro report", " · ".join(f"{r.label} ({r.kind})" for r in runs),
                          index_body(runs, refused, len(groups) > 1, made, tasks, shown, link),
                          [("#rows", "rows"), ("#plots", "plots"), ("#trajectories", "trajectories"),
                           ("#runs", "runs")]))
    if refused:
        print(f"repro report: {refused}", file=sys.stderr)
    return Report(index, refused, len(chosen) + len(shown) + 1)


def index_body(runs: list[Run], refused: str | None, compare: bool, made: list[tuple[str, str, bool]],
               tasks: list[TaskSamples], shown: list[TaskSamples], link: Any) -> str:
    """``compare``: the runs came as several arguments (a sweep's cells are separate specs, never compared)."""
    parts = []
    if refused:
        parts.append(tag("div", esc(refused), class_="banner refused", id_="refused"))
    rows = "".join(rows_section([r]) for r in runs) if refused else rows_section(runs)
    parts.append(tag("section", tag("h2", "Rows") + rows, id_="rows"))
    if compare and not refused:
        parts.append(comparison_section([r for r in runs if r.metrics]))
    parts.append(tag("section", tag("h2", "Plots") + plots_section(made), id_="plots"))
    trajectories = [tag("h2", "Trajectories")]
    if not tasks:
        trajectories.append(tag("p", "no graded samples in these runs", class_="muted"))
    else:
        intro = "A failed and a solved rollout of the same task, turn by turn; every task below has its own page."
        left = f" ({len(tasks) - len(shown)} more tasks without a page)" if len(tasks) > len(shown) else ""
        trajectories += [tag("p", esc(intro), class_="note"), side_by_side(tasks[0], link),
                         tag("h3", esc(f"tasks ({len(tasks)}){left}")),
                         _tasks_table(tasks, {t.instance_id for t in shown})]
    parts.append(tag("section", "".join(trajectories), id_="trajectories"))
    parts.append(tag("section", tag("h2", "Runs") + runs_section(runs), id_="runs"))
    return "".join(parts)

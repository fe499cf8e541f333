"""Plots of runs for `repro report` and `repro table`, from plain data (dicts, DataFrames), saved as SVG.

Figures are built with matplotlib's object API (no pyplot, no global backend) and saved with a fixed
``svg.hashsalt`` and no date, text kept as text: the same inputs give byte-identical files, so regenerating a
report or ``results/`` with unchanged runs changes nothing.
"""

from __future__ import annotations

import io
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

SVG_RC = {"svg.hashsalt": "repro", "svg.fonttype": "none", "font.size": 9, "axes.titlesize": 10,
          "axes.spines.top": False, "axes.spines.right": False, "font.family": "DejaVu Sans"}
COLORS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563")

RL_PANELS = (("reward_mean", "reward (mean)"), ("mixed_group_share", "mixed-group share"),
             ("clip_fraction", "clip fraction"), ("entropy", "entropy (nats)"),
             ("log_ratio_first_max", "max |log ratio|, first update"))


def svg_bytes(fig: Figure) -> bytes:
    """The figure as SVG bytes, deterministic for the same figure."""
    buffer = io.BytesIO()
    with matplotlib.rc_context(SVG_RC):
        fig.savefig(buffer, format="svg", metadata={"Date": None}, bbox_inches="tight")
    return buffer.getvalue()


def save_svg(fig: Figure, path: Path) -> Path:
    """Write ``fig`` to ``path`` (only when its bytes changed, so an unchanged file keeps its time)."""
    data = svg_bytes(fig)
    if not path.exists() or path.read_bytes() != data:
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    return path


def _figure(width: float, height: float) -> Figure:
    with matplotlib.rc_context(SVG_RC):
        return Figure(figsize=(width, height), layout="constrained")


def short_labels(ids: Sequence[str]) -> list[str]:
    """Instance ids without the prefix they all share (``repro-bundled__procedural-s0-test-``) and a trailing hash
    (``-0f29afe2``), where the rest still tells them apart."""
    if len(ids) < 2:
        return [i.rsplit("__", 1)[-1] for i in ids]
    bare = [re.sub(r"-[0-9a-f]{8}$", "", i) for i in ids]
    if len(set(bare)) == len(ids):
        ids = bare
    prefix = ids[0]
    for other in ids[1:]:
        prefix = prefix[:next((n for n, (a, b) in enumerate(zip(prefix, other, strict=False)) if a != b),
                              min(len(prefix), len(other)))]
    cut = max(prefix.rfind("-"), prefix.rfind("_")) + 1
    return [i[cut:] or i for i in ids]


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#6b7280")
    ax.set_xticks([])
    ax.set_yticks([])


def rl_diagnostics(frame: pd.DataFrame) -> Figure:
    """Per RL step (columns ``step`` and :data:`RL_PANELS`; ``run`` when several): one panel per diagnostic, a
    line per run."""
    with matplotlib.rc_context(SVG_RC):
        fig = _figure(11, 2.3)
        axes = fig.subplots(1, len(RL_PANELS))
        runs = list(dict.fromkeys(frame["run"])) if "run" in frame else [None]
        for ax, (column, title) in zip(axes, RL_PANELS, strict=True):
            ax.set_title(title)
            ax.set_xlabel("RL step")
            if column not in frame:
                _empty(ax, "not recorded")
                continue
            for i, run in enumerate(runs):
                part = frame if run is None else frame[frame["run"] == run]
                ax.plot(part["step"] + 1, part[column], marker="o", markersize=3, color=COLORS[i % len(COLORS)],
                        label=None if run is None else str(run))
            if column == "log_ratio_first_max" and (frame[column] > 0).all():
                ax.set_yscale("log")
            else:
                ax.ticklabel_format(axis="y", useOffset=False)
            ax.xaxis.get_major_locator().set_params(integer=True)
        if len(runs) > 1:  # below the panels: inside one it would hide the lines
            handles, labels = axes[0].get_legend_handles_labels()
            fig.legend(handles, labels, loc="outside lower center", ncol=min(len(runs), 5), fontsize=7, frameon=False)
    return fig


def before_after_outcomes(before: Mapping[str, float], after: Mapping[str, float],
                          labels: tuple[str, str] = ("before", "after")) -> Figure:
    """Each instance's share of solved samples before and after (a dumbbell per instance)."""
    ids = sorted(set(before) | set(after))
    with matplotlib.rc_context(SVG_RC):
        fig = _figure(4, max(2.6, 1.2 + 0.3 * len(ids)))
        ax = fig.subplots()
        ax.set_title("solved share per instance")
        if not ids:
            _empty(ax, "no instances")
            return fig
        for y, instance in enumerate(ids):
            a, b = before.get(instance), after.get(instance)
            if a is not None and b is not None:
                ax.plot([a, b], [y, y], color="#9ca3af", linewidth=1, zorder=1)
        ys = range(len(ids))
        ax.scatter([before.get(i, math.nan) for i in ids], ys, color=COLORS[6], label=labels[0], zorder=2, s=18)
        ax.scatter([after.get(i, math.nan) for i in ids], ys, color=COLORS[0], label=labels[1], zorder=3, s=18,
                   marker="D")
        ax.set_yticks(list(ys), short_labels(ids), fontsize=8)
        ax.set_xlim(-0.05, 1.05)
        ax.set_xlabel("share of samples resolved")
        ax.invert_yaxis()
        ax.legend(fontsize=7, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2)
    return fig


def pass_at_k(curves: Mapping[str, Mapping[str, float]]) -> Figure:
    """pass@k against k, one line per label (``{label: {"1": 0.2, "2": 0.3}}``)."""
    with matplotlib.rc_context(SVG_RC):
        fig = _figure(4, 2.6)
        ax = fig.subplots()
        ax.set_title("pass@k")
        for i, (label, curve) in enumerate(curves.items()):
            ks = sorted(curve, key=int)
            ax.plot([int(k) for k in ks], [100 * curve[k] for k in ks], marker="o", markersize=4,
                    color=COLORS[i % len(COLORS)], label=label)
        ax.set_xlabel("k (samples per task)")
        ax.set_ylabel("% of tasks solved")
        ax.set_ylim(bottom=0)
        ax.xaxis.get_major_locator().set_params(integer=True)
        if curves:
            ax.legend(fontsize=7, frameon=False)
        else:
            _empty(ax, "no pass@k recorded")
    return fig


def calls_histogram(histograms: Mapping[str, Mapping[str, int]]) -> Figure:
    """Share of rollouts per number of model calls, grouped bars per label (``{label: {"3": 8}}``)."""
    counts = sorted({int(n) for h in histograms.values() for n in h})
    with matplotlib.rc_context(SVG_RC):
        fig = _figure(4, 2.6)
        ax = fig.subplots()
        ax.set_title("model calls per rollout")
        if not counts:
            _empty(ax, "no calls recorded")
            return fig
        width = 0.8 / max(len(histograms), 1)
        for i, (label, histogram) in enumerate(histograms.items()):
            total = sum(histogram.values()) or 1
            xs = [n + (i - (len(histograms) - 1) / 2) * width for n in counts]
            ax.bar(xs, [100 * histogram.get(str(n), 0) / total for n in counts], width=width,
                   color=COLORS[i % len(COLORS)], label=f"{label} ({sum(histogram.values())})")
        ax.set_xticks(counts)
        ax.set_xlabel("calls")
        ax.set_ylabel("% of rollouts")
        ax.legend(fontsize=7, frameon=False)
    return fig


def pass_at_1_bars(frame: pd.DataFrame) -> Figure:
    """Pass@1 with its interval per row (columns ``experiment``, ``pass_at_1``, ``ci_low``, ``ci_high``; the
    eval tables' CSV)."""
    labels = [f"{e} ({str(f)[:8]})" if "fingerprint" in frame else str(e)
              for e, f in zip(frame["experiment"], frame.get("fingerprint", frame["experiment"]), strict=True)]
    with matplotlib.rc_context(SVG_RC):
        fig = _figure(5.5, 0.8 + 0.35 * max(len(frame), 1))
        ax = fig.subplots()
        ax.set_title("Pass@1 with 95% interval")
        ys = list(range(len(frame)))
        values = 100 * frame["pass_at_1"].astype(float)
        low, high = 100 * frame["ci_low"].astype(float), 100 * frame["ci_high"].astype(float)
        ax.barh(ys, values, color=COLORS[0], height=0.6)
        ax.errorbar(values, ys, xerr=[values - low, high - values], fmt="none", ecolor="#111827", capsize=3)
        ax.set_yticks(ys, labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlim(0, 100)
        ax.set_xlabel("Pass@1 (%)")
    return fig


def distribution_labels(names: Sequence[str]) -> list[str]:
    """Task-distribution names (``bundled:procedural:test:one_step:n50:s0``) without the ``:``-parts they all share
    at the front, one part per line, so that neighbouring labels do not overlap."""
    parts = [name.split(":") for name in names]
    shared = 0
    while len(parts) > 1 and all(len(p) > shared + 1 and p[shared] == parts[0][shared] for p in parts):
        shared += 1
    return ["\n".join(p[shared:]) for p in parts]


def _annotated_heatmap(grid: list[list[float]], texts: list[list[str]], columns: list[str], rows: list[str],
                       title: str, top: float, size: tuple[float, float],
                       axis_labels: tuple[str, str] | None = None) -> Figure:
    """Pass@1 (%) in ``grid`` (rows x columns, NaN: no cell) as a heatmap from 0 to ``top``, each cell annotated
    with its text (white on the darkest cells)."""
    with matplotlib.rc_context(SVG_RC):
        fig = _figure(*size)
        ax = fig.subplots()
        image = ax.imshow(grid, cmap="Blues", vmin=0, vmax=top, aspect="auto")
        for y, row in enumerate(texts):
            for x, text in enumerate(row):
                if text:
                    dark = grid[y][x] > 0.6 * top
                    ax.text(x, y, text, ha="center", va="center", fontsize=8, color="white" if dark else "#111827")
        ax.set_xticks(range(len(columns)), columns, fontsize=8)
        ax.set_yticks(range(len(rows)), rows, fontsize=8)
        if axis_labels:
            ax.set_xlabel(axis_labels[0])
            ax.set_ylabel(axis_labels[1])
        ax.spines[:].set_visible(False)
        ax.set_title(title)
        fig.colorbar(image, ax=ax, label="Pass@1 (%)", shrink=0.8)
    return fig


def sweep_heatmap(cells: pd.DataFrame) -> Figure:
    """The harness x task-distribution matrix (columns ``harness``, ``tasks``, ``pass_at_1``, ``n_tasks``; the
    sweep table's CSV) as a heatmap of Pass@1, each cell annotated. With a ``model`` column, only the last row's
    model is drawn (the sweep table's CSV lists the most recently evaluated model last)."""
    if "model" in cells.columns:
        cells = cells[cells["model"] == cells["model"].iloc[-1]]
    harnesses = sorted(set(cells["harness"]))
    tasks = sorted(set(cells["tasks"]))
    values = {(r.harness, r.tasks): r for r in cells.itertuples()}
    grid = [[100 * values[(h, t)].pass_at_1 if (h, t) in values else math.nan for t in tasks] for h in harnesses]
    texts = [["-" if (h, t) not in values else f"{100 * values[(h, t)].pass_at_1:.1f}%\nn={values[(h, t)].n_tasks}"
              for t in tasks] for h in harnesses]
    return _annotated_heatmap(grid, texts, distribution_labels(tasks), harnesses, "Pass@1: harness x task distribution",
                              100, (1.8 + 1.9 * len(tasks), 0.9 + 0.55 * len(harnesses)))


def matrix_heatmap(rows: pd.DataFrame) -> Figure:
    """Trained in x evaluated in (columns ``trained in``, ``evaluated in``, ``pass_at_1``, ``seed``; the harness
    matrix's CSV, a line per seed) as a heatmap of Pass@1 averaged over the seeds, each cell annotated. With a
    ``configuration`` column, only the last row's configuration is drawn (the newest: configurations differ in
    harnesses, tasks or training, so their cells are not averaged)."""
    title = "Pass@1, mean over seeds: trained in x evaluated in"
    if "configuration" in rows.columns:
        rows = rows[rows["configuration"] == rows["configuration"].iloc[-1]]
        title += f" (configuration {rows['configuration'].iloc[-1]}, the newest)"
    means = rows.groupby(["trained in", "evaluated in"], sort=False)["pass_at_1"].agg(["mean", "count"])
    trained = list(dict.fromkeys(rows["trained in"]))
    evaluated = sorted(set(rows["evaluated in"]))
    grid = [[100 * means.loc[(t, e), "mean"] if (t, e) in means.index else math.nan for e in evaluated]
            for t in trained]
    texts = [[f"{100 * means.loc[(t, e), 'mean']:.1f}%\n{int(means.loc[(t, e), 'count'])} seed(s)"
              if (t, e) in means.index else "" for e in evaluated] for t in trained]
    top = max(40.0, *(v for row in grid for v in row if not math.isnan(v)))
    return _annotated_heatmap(grid, texts, [f"in {e}" for e in evaluated], trained,
                              title, top,
                              (2.2 + 1.6 * len(evaluated), 0.9 + 0.5 * len(trained)), ("evaluated in", "trained in"))

"""The plot beside a published table, drawn from the table's own CSV.

`repro table` writes each table's CSV and then plots that file (read back), so a plot shows exactly the rows a
reader can download, and `repro table --replot` redraws the plots of a `results/` folder whose runs are not on this
machine (run directories are not kept in git) from its committed CSVs alone, with the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from repro.report.plots import matrix_heatmap, pass_at_1_bars, rl_diagnostics, save_svg, sweep_heatmap


def _columns(*names: str) -> frozenset[str]:
    return frozenset(names)


# (columns a CSV must have, figure, the Markdown image's alt text): the first match wins
PLOTS: tuple[tuple[frozenset[str], Callable[[pd.DataFrame], Figure], str], ...] = (
    (_columns("step", "reward_mean"), rl_diagnostics, "RL diagnostics per step"),
    (_columns("trained in", "evaluated in", "pass_at_1"), matrix_heatmap, "Pass@1 per training and evaluation harness"),
    (_columns("harness", "tasks", "pass_at_1", "n_tasks"), sweep_heatmap, "Pass@1 per harness and task distribution"),
    (_columns("experiment", "pass_at_1", "ci_low", "ci_high"), pass_at_1_bars, "Pass@1 with its interval per row"),
)


def plot_of(csv: Path) -> tuple[Path, str] | None:
    """Draw ``csv``'s plot into ``<stem>.svg`` beside it; returns (the SVG, its alt text), or None for a table
    without a plot (or no rows)."""
    frame = pd.read_csv(csv)
    for columns, figure, alt in PLOTS:
        if columns <= set(frame.columns) and not frame.empty:
            return save_svg(figure(frame), csv.with_suffix(".svg")), alt
    return None


def table_plot(csv: Path) -> tuple[Path, str]:
    """:func:`plot_of` for a table that always has a plot (its writer made the CSV for it)."""
    drawn = plot_of(csv)
    if drawn is None:
        raise ValueError(f"{csv}: no plot matches its columns or it has no rows")
    return drawn


def image_link(svg: Path, alt: str) -> str:
    """The Markdown line that shows ``svg`` (a path relative to the Markdown file beside it)."""
    return f"![{alt}]({svg.name})"


def replot(results: Path) -> list[Path]:
    """Redraw every plot of ``results`` from its CSVs and link each from its table's Markdown where the link is
    missing (a table published before plots existed); returns the files written or checked."""
    written = []
    for csv in sorted(results.glob("*.csv")):
        drawn = plot_of(csv)
        if drawn is None:
            continue
        svg, alt = drawn
        written.append(svg)
        for md, line in _markdown_showing(csv, image_link(svg, alt)):
            if f"]({svg.name})" not in md.read_text():
                own_plot_first = _is_diagnostics(csv) and md == csv.with_suffix(".md")
                md.write_text(_with_line(md.read_text(), line, before_table=own_plot_first))
                written.append(md)
    return written


def _with_line(text: str, line: str, before_table: bool) -> str:
    """``text`` with ``line`` added: before its first table row when ``before_table`` (where `repro table` puts a
    table's own plot), else at the end."""
    lines = text.rstrip("\n").split("\n")
    at = next((i for i, row in enumerate(lines) if row.startswith("|")), None) if before_table else None
    if at is None:
        return "\n".join([*lines, "", line]) + "\n"
    return "\n".join([*lines[:at], line, "", *lines[at:]]) + "\n"


def diagnostics_link_line(link: str, diagnostics_md: Path) -> str:
    """The line a main table carries for its RL diagnostics: the plot, and where every step is listed."""
    return f"{link} (every step in [{diagnostics_md.name}]({diagnostics_md.name}))"


def _is_diagnostics(csv: Path) -> bool:
    return csv.stem.endswith("_diagnostics")


def _markdown_showing(csv: Path, link: str) -> list[tuple[Path, str]]:
    """The Markdown files that show ``csv``'s plot, with the line each shows it by: its own table, and for a
    diagnostics table also the main one."""
    own = csv.with_suffix(".md")
    files = [(own, link)]
    if _is_diagnostics(csv):
        files.append((csv.with_name(csv.stem.removesuffix("_diagnostics") + ".md"), diagnostics_link_line(link, own)))
    return [(md, line) for md, line in files if md.exists()]

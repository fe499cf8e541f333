"""Where a table's runs and files go: the table a run belongs to (its ``table``, else its experiment), the file
stem of a table name, and the ``<table>.md`` / ``.csv`` pair most kinds write (of every run, or of the newest)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from repro.common.configs import split_table_name
from repro.report.protocol import split_name


def table_name(run: dict[str, Any]) -> str:
    """The table a run belongs to: its ``table``, else its experiment, with ``_validation`` added when it scored
    the validation split and the name does not say so already: a validation run never joins its experiment's test
    table, whatever name it was run under."""
    return split_table_name(str(run.get("table") or run["experiment"]), split_name(run))


def by_table(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Runs per table name (:func:`table_name`), in order."""
    tables: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        tables.setdefault(table_name(run), []).append(run)
    return tables


def table_file_stem(name: str) -> str:
    """A table name as a file name (characters other than letters, digits, ``._-`` replaced)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "eval"


Rows = list[dict[str, Any]]


def _none(run: dict[str, Any]) -> Rows:
    return []


def write_named_tables(runs: Rows, results: Path, markdown: Callable[[Rows], str],
                       csv_rows: Callable[[dict[str, Any]], Rows] | None = None,
                       table_csv_rows: Callable[[Rows], Rows] | None = None) -> list[Path]:
    """``results/<table>.md`` (``markdown`` of the table's runs) and ``.csv`` (``csv_rows`` of each run, or
    ``table_csv_rows`` of all of them: the pooled rows too), per table name (a run's ``table``, else its
    experiment)."""
    written = []
    for name, rows in by_table(runs).items():
        md, csv = results / f"{name}.md", results / f"{name}.csv"
        md.write_text(f"# {name}\n\n" + markdown(rows))
        lines = table_csv_rows(rows) if table_csv_rows else [r for run in rows for r in (csv_rows or _none)(run)]
        pd.DataFrame(lines).to_csv(csv, index=False)
        written += [md, csv]
    return written


def write_newest_table(runs: Rows, results: Path, stem: str, markdown: Callable[[Rows], str],
                       frame: Callable[[dict[str, Any]], pd.DataFrame]) -> list[Path]:
    """``results/<stem>.md`` (``markdown`` of the runs: it shows the newest) and ``.csv`` (``frame`` of the newest
    run): the tables of benchmarks, where a rerun replaces the last."""
    md, csv = results / f"{stem}.md", results / f"{stem}.csv"
    md.write_text(markdown(runs))
    frame(runs[-1]).to_csv(csv, index=False)
    return [md, csv]


def source_line(metrics: dict[str, Any], experiment: str) -> str:
    """Where a benchmark table's numbers come from: the run, its commit and cores, and the commands."""
    return (f"Source: `{metrics.get('run_dir', '?')}` · git {metrics.get('git_sha') or '?'} · "
            f"{metrics.get('cpu_count', '?')} cores · `repro run experiment={experiment}` then `repro table`.")

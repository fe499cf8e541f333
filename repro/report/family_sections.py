"""What a change is made of: Pass@1 before and after, per task family, with the slipped edits beside.

A total can hide where a gain comes from. In the miniature the families are the mutation operators of the bundled
tasks (two of them carry the scripted expert's planted ``sed -n`` slip, one does not); for SWE-bench-shaped rows a
family is the repository. Every before/after, matrix and loop table prints these rows beside its totals.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from repro.evaluation.paired import paired_summary
from repro.report.cells import paired_cells, pct
from repro.report.table_files import by_table
from repro.tasks.mutate import OPERATORS

ALL = "all"
_SWEBENCH_ID = "__"  # owner__repo-1234
Slips = dict[str, list[int]]  # family -> [samples with a slipped edit, samples]
Sections = list[tuple[dict[str, Any], list[dict[str, Any]]]]  # (the columns naming a comparison, its rows)


def family_of(instance_id: str) -> str:
    """The family of a held-out instance: the mutation operator of a bundled task (``...-operator_swap-lc-...``),
    the repository of a SWE-bench-shaped id (``owner__repo-1234`` -> ``owner/repo``), else ``other``."""
    if instance_id.startswith("repro-bundled__"):
        found = [op for op in OPERATORS if f"-{op}-" in instance_id]
        return found[0] if found else "other"
    if _SWEBENCH_ID in instance_id:
        owner, rest = instance_id.split(_SWEBENCH_ID, 1)
        return f"{owner}/{rest.rsplit('-', 1)[0]}" if "-" in rest else f"{owner}/{rest}"
    return "other"


def split_by_family(values: dict[str, float]) -> dict[str, dict[str, float]]:
    """Per-instance values per family, largest family first (then by name)."""
    groups: dict[str, dict[str, float]] = {}
    for instance, value in values.items():
        groups.setdefault(family_of(instance), {})[instance] = value
    return dict(sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])))


def summed_slips(habits: list[dict[str, Any] | None]) -> Slips | None:
    """``{family: [slipped, samples]}`` summed over runs (seeds); None when any run did not count them."""
    if not habits or any(not h for h in habits):
        return None
    total: Slips = {}
    for h in habits:
        for family, (slipped, samples) in h["by_operator"].items():
            counts = total.setdefault(family, [0, 0])
            counts[0] += slipped
            counts[1] += samples
    all_counts = [sum(c[0] for c in total.values()), sum(c[1] for c in total.values())]
    return {**total, ALL: all_counts}


def _slip_cell(before: Slips | None, after: Slips | None, family: str) -> str:
    if before is None or after is None or family not in before or family not in after:
        return "-"
    (sb, nb), (sa, na) = before[family], after[family]
    return f"{pct(sb / nb if nb else None)} -> {pct(sa / na if na else None)}"


def family_rows(before: dict[str, float], after: dict[str, float], slips_before: Slips | None = None,
                slips_after: Slips | None = None, sides: tuple[str, str] = ("before", "after")) -> list[dict[str, Any]]:
    """One row per family and one for all tasks: tasks, share, Pass@1 of both sides (``before`` and ``after``,
    named by ``sides``: means of the per-instance values), the paired difference ``after - before`` with its
    interval, MDE and sign-flip p, and the slipped edits of both sides."""
    first, second = sides
    groups = split_by_family(after)
    groups[ALL] = after
    rows = []
    for family, values in groups.items():
        base = {i: before[i] for i in values}
        paired = paired_summary(base, values)
        rows.append({"family": family, "tasks": len(values), "share": pct(len(values) / len(after)),
                     f"Pass@1 {first}": pct(statistics.fmean(base.values())),
                     f"Pass@1 {second}": pct(statistics.fmean(values.values())), **paired_cells(paired),
                     f"slipped edits {first} -> {second}": _slip_cell(slips_before, slips_after, family)})
    return rows


def family_frame(sections: Sections) -> pd.DataFrame:
    """Rows of several comparisons, each prefixed by the columns that name it (``{"arm": "proxy"}``...)."""
    return pd.DataFrame([{**label, **row} for label, rows in sections for row in rows])


def family_markdown(frame: pd.DataFrame, what: str) -> list[str]:
    """The section a table prints: the rows and how to read them (a slip column no record counted is left out,
    and the text says so)."""
    uncounted = [c for c in frame.columns if c.startswith("slipped edits") and (frame[c] == "-").all()]
    note = (" These runs' records did not count slipped edits (runs made before the count was added to their "
            "experiment)." if uncounted else "")
    return [f"### What changed, by task family ({what})", "",
            frame.drop(columns=uncounted).to_markdown(index=False, disable_numparse=True), "",
            "Family: the mutation operator of a bundled task (for SWE-bench rows, the repository). Pass@1 per "
            "family is the mean over its tasks of the per-instance solved share; the difference is paired over the "
            "family's tasks (bootstrap interval, sign-flip p, MDE at alpha 0.05 and 80% power). Slipped edits: "
            "held-out samples whose rollout issued the scripted expert's planted `sed -n` edit (prints, does not "
            "edit), counted by code from the stored calls; the expert slips on `comparison_flip` and "
            "`off_by_one` demonstrations only, so a gain there can be RL removing that habit, not new ability "
            f"(`docs/miniature.md`).{note}", ""]


def write_family_csvs(runs: list[dict[str, Any]], results: Path,
                      sections_of: Callable[[list[dict[str, Any]]], Sections]) -> list[Path]:
    """``results/<table>_families.csv`` per table name with sections (``sections_of`` a table's runs)."""
    written = []
    for name, table_runs in by_table(runs).items():
        sections = sections_of(table_runs)
        if sections:
            path = results / f"{name}_families.csv"
            family_frame(sections).to_csv(path, index=False)
            written.append(path)
    return written

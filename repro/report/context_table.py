"""``results/context_profile.md`` and ``.csv``: what each harness's context management makes of the same rollouts at
a small served window, the newest run (:mod:`repro.experiments.context_profile`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from repro.report.table_files import source_line, write_newest_table


def _window(row: dict[str, Any]) -> str:
    return "room" if row["window"] is None else f"{row['window']:,} (+{row['headroom']:,})"


def _compaction(arm: dict[str, Any], row: dict[str, Any]) -> str:
    if row["window"] is None:
        return "-"
    if row["compaction"] == "compacting_below":
        return f"compacting_below, margin {arm['margin']:,}"
    return row["compaction"] or "its own"


def context_frame(metrics: dict[str, Any]) -> pd.DataFrame:
    """One row per arm and window."""
    rows = []
    for arm in metrics["arms"]:
        for row in arm["windows"]:
            rows.append({
                "harness": arm["label"], "compaction set": _compaction(arm, row),
                "window (headroom)": _window(row), "first prompt": row["first_prompt_max"],
                "rollouts": row["rollouts"], "Pass@1": round(row["pass_at_1"], 3),
                "calls mean": round(row["calls_mean"], 2), "calls max": row["calls_max"],
                "rows mean": round(row["rows_mean"], 2), "rows max": row["rows_max"],
                "several rows": round(row["several_rows"], 3), "refused": round(row["refused"], 3),
                "context_exceeded": round(row["context_exceeded"], 3), "infra failures": row["infra_failures"]})
    return pd.DataFrame(rows)


def context_markdown(runs: list[dict[str, Any]]) -> str:
    """Markdown for the newest context-profile run, with its provenance."""
    metrics = runs[-1]
    cfg = metrics["config"]
    lines = [
        "# Context per harness",
        "",
        f"Each harness, unchanged, runs the scripted expert on the same {cfg['n_tasks']} bundled `{cfg['difficulty']}` "
        "tasks through the real proxy, graded by the real grader: first with room (which measures its first "
        "prompt, the largest over the tasks), then on a server whose window is that first prompt + the forced "
        f"`max_tokens` ({cfg['max_tokens']}) + a headroom. `compaction set`: how the harness was told to compact "
        "before the window (`its own`: as it comes, also where the arm's margin is not below the headroom; OpenHands' "
        "condenser then acts on the server's refusal). Per "
        "rollout: `calls` recorded (side calls and refused ones included), `rows` its training rows "
        "(`prefix_merge` chains: every sampled token in exactly one; more than one when a compaction or a side "
        "call starts a prompt that extends no earlier one), `refused` the share with a call refused as too long, "
        "`context_exceeded` the share that ended on one (graded unresolved, not an infrastructure failure). "
        "The expert is the miniature's demonstrator, not a trained policy: this measures the harnesses' context "
        "machinery on fixed behaviour.",
        "",
        context_frame(metrics).to_markdown(index=False),
        "",
        source_line(metrics, "context_profile"),
    ]
    return "\n".join(lines) + "\n"


def write_context_tables(runs: list[dict[str, Any]], results: Path) -> list[Path]:
    """``results/context_profile.md`` (the newest run) and ``.csv``."""
    return write_newest_table(runs, results, "context_profile", context_markdown, context_frame)

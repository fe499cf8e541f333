"""``results/jail_overhead.md`` and ``.csv``: the jail benchmark's newest run
(``repro.experiments.bench.jail_overhead``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from repro.report.table_files import source_line, write_newest_table

PRIMITIVES = {"true": "start `/bin/true`", "fetch": "one HTTP fetch through the relay (Python start included)"}


def jail_overhead_frame(metrics: dict[str, Any]) -> pd.DataFrame:
    """One row per measurement: what, direct, jailed, added (milliseconds)."""
    rows = []
    for key, what in PRIMITIVES.items():
        direct, jailed = metrics["primitives"][f"{key}_direct"], metrics["primitives"][f"{key}_jailed"]
        rows.append({"measurement": what, "unit": "ms, median (p90)",
                     "direct": f"{direct['median_ms']:.1f} ({direct['p90_ms']:.1f})",
                     "jailed": f"{jailed['median_ms']:.1f} ({jailed['p90_ms']:.1f})",
                     "added": f"{jailed['median_ms'] - direct['median_ms']:+.1f}"})
    mini = metrics["mini_swe_agent"]
    none, jail = mini["modes"]["none"], mini["modes"]["jail"]
    rows.append({"measurement": "mini-SWE-agent 2.x, per agent command", "unit": "ms, mean",
                 "direct": f"{none['ms_per_command']:.1f}", "jailed": f"{jail['ms_per_command']:.1f}",
                 "added": f"{mini['added_ms_per_command']:+.1f}"})
    rows.append({"measurement": "mini-SWE-agent 2.x, per rollout", "unit": "s, mean",
                 "direct": f"{none['s_per_rollout']:.3f}", "jailed": f"{jail['s_per_rollout']:.3f}",
                 "added": f"{mini['added_s_per_rollout']:+.3f}"})
    return pd.DataFrame(rows)


def jail_overhead_markdown(runs: list[dict[str, Any]]) -> str:
    """Markdown for the newest jail benchmark run, with its provenance."""
    metrics = runs[-1]
    cfg, mini = metrics["config"], metrics["mini_swe_agent"]
    none, jail = mini["modes"]["none"], mini["modes"]["jail"]
    lines = [
        "# What a rollout's jail costs",
        "",
        f"Primitives: {cfg['n']} interleaved repeats. mini-SWE-agent 2.x (the default harness, sandbox=local): "
        f"{none['rollouts']} rollouts per mode in {cfg['blocks']} interleaved blocks, {cfg['concurrency']} in flight, "
        f"each {cfg['steps']} commands (`ls` + `head`, a `python -c` import) and a submit, answered by a scripted "
        "chat stub (no model), so the difference is the jail's: one jail per rollout (namespaces, a new root, "
        "`/proc`), each command entering it with `nsenter`. Per command and per rollout are wall seconds "
        "x concurrency / count. Submitted: "
        f"{none['submitted']}/{none['rollouts']} unjailed, {jail['submitted']}/{jail['rollouts']} jailed.",
        "",
        jail_overhead_frame(metrics).to_markdown(index=False),
        "",
        source_line(metrics, "bench_jail"),
    ]
    return "\n".join(lines) + "\n"


def write_jail_overhead_tables(runs: list[dict[str, Any]], results: Path) -> list[Path]:
    """``results/jail_overhead.md`` (the newest run) and ``.csv``."""
    return write_newest_table(runs, results, "jail_overhead", jail_overhead_markdown, jail_overhead_frame)

"""Tables of ``eval_docker`` runs: one checkpoint under ``sandbox=local`` and ``sandbox=docker``, and what a
container costs per rollout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from repro.report.cells import paired_cells, pass_cell
from repro.report.table_files import write_named_tables


def _seconds(q: dict[str, Any]) -> str:
    return f"{q['median_s'] * 1000:.0f} ms (p90 {q['p90_s'] * 1000:.0f})"


def results_frame(runs: list[dict[str, Any]]) -> pd.DataFrame:
    rows = []
    for run in runs:
        local, docker, diff = run["arms"]["local"], run["arms"]["docker"], run["docker_minus_local"]
        cells = paired_cells(diff)  # the same outcome on every instance is said so, not printed as +0.0 and p 1
        rows.append({
            "run": Path(run["run_dir"]).name, "model": run["model"], "n": local["n_tasks"], "k": run["k"],
            "Pass@1 local": pass_cell(local), "Pass@1 docker": pass_cell(docker),
            "docker - local [95% CI]": cells["delta [95% CI]"], "sign-flip p": cells["sign-flip p"],
            "infra failures local / docker": f"{local['counts']['infra_failures']} / "
                                             f"{docker['counts']['infra_failures']}",
            "fingerprints local / docker": f"{local['fingerprint']} / {docker['fingerprint']}",
        })
    return pd.DataFrame(rows)


def costs_frame(runs: list[dict[str, Any]]) -> pd.DataFrame:
    rows = []
    for run in runs:
        for arm in ("local", "docker"):
            costs, times = run["container_costs"][arm], run["arms"][arm]["rollout_times"]
            rows.append({
                "run": Path(run["run_dir"]).name, "sandbox": arm,
                "start (workspace / container)": _seconds(costs["start"]), "one command": _seconds(costs["command"]),
                "teardown": _seconds(costs["teardown"]), "harness per rollout": _seconds(times["harness"]),
                "grading per sample": _seconds(times["grade"]),
                "eval wall": f"{run['arms'][arm]['durations_s']['evaluation']:.0f} s",
            })
    return pd.DataFrame(rows)


NOTES = ("One checkpoint, the same held-out tasks and per-(task, sample) seeds, evaluated in the real "
         "mini-SWE-agent under each sandbox in one run (one model server, one proxy). Pass@1 with 95% Wilson "
         "intervals; docker - local is the paired difference of per-task pass rates (bootstrap interval, sign-flip "
         "p). Costs: start / one command (`true`) / teardown of a workspace, measured in the same run on the first "
         "{n} tasks (median and p90); harness per rollout and grading per sample from the evaluation itself.")


def run_markdown(runs: list[dict[str, Any]]) -> str:
    """The table's body: the results, then the costs."""
    images = runs[-1].get("images", {})
    return "\n\n".join([
        NOTES.format(n=runs[-1]["container_costs"]["docker"]["start"]["n"]),
        results_frame(runs).to_markdown(index=False),
        "## What a container costs per rollout", costs_frame(runs).to_markdown(index=False),
        f"Images: {images.get('tasks', 0)} task images ({images.get('built', 0)} built in this run, "
        f"{images.get('cached', 0)} cached), base `{images.get('base', '-')}`. Container limits: "
        f"{runs[-1].get('docker_limits', {})}. Tasks: `{runs[-1]['task_distribution']}`.",
    ]) + "\n"


def csv_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"run": Path(run["run_dir"]).name, "sandbox": arm, "pass_at_1": run["arms"][arm]["pass_at_1"],
             "n_tasks": run["arms"][arm]["n_tasks"], "fingerprint": run["arms"][arm]["fingerprint"],
             **{f"{step}_median_s": q["median_s"] for step, q in run["container_costs"][arm].items()}}
            for arm in ("local", "docker")]


def write_eval_docker_tables(runs: list[dict[str, Any]], results: Path) -> list[Path]:
    """``results/<table>.md`` and ``.csv`` for eval_docker runs."""
    return write_named_tables(sorted(runs, key=lambda r: r.get("started_at", 0)), results, run_markdown, csv_rows)

"""Tables of ``harness_matrix`` runs: trained in (rows) x evaluated in (columns), and for each evaluation harness
what training there gains over training elsewhere. Seeds of one configuration are pooled by averaging each held-out
instance over them before pairing (the miniature's rule); per-seed values are in the CSV."""

from __future__ import annotations

import hashlib
import statistics
from pathlib import Path
from typing import Any

import pandas as pd

from repro.evaluation.paired import paired_summary
from repro.report.before_after import mean_over_seeds, seed_groups
from repro.report.cells import command_line, delta_cell, mean_cell, paired_cells, pass_cell, run_name, seeds_cell
from repro.report.family_sections import (
    Sections,
    family_frame,
    family_markdown,
    family_rows,
    summed_slips,
    write_family_csvs,
)
from repro.report.protocol import protocol_note
from repro.report.table_files import write_named_tables
from repro.report.table_plots import image_link, table_plot

WARM = "warm start"
REPLAY_NOTE = ("A replayed turn counts as divergent when its prompt differs from the harness's by any token. The "
               "replay runs each rollout in a fresh working copy named `replay-<rollout id>`, so a turn whose "
               "observation echoes the working copy's path differs by that name alone (the first difference that "
               "`loop_comparison.md` shows for 2.4.6): for 2.4.6 the count is an upper bound on differences of the "
               "loop itself.")


def config_key(run: dict[str, Any]) -> tuple:
    rl = {k: v for k, v in run["rl"].items() if k != "seed"}
    trainer = {k: v for k, v in run.get("trainer", {}).items() if k != "seed"}
    return (repr(sorted(run["fingerprints"].items())), run["train_tasks"], tuple(sorted(run["arms"])),
            repr(sorted(rl.items())), repr(sorted(trainer.items())))


def config_label(run: dict[str, Any]) -> str:
    """A short name of the run's configuration (:func:`config_key`), so that the CSV tells configurations apart."""
    return hashlib.sha256(repr(config_key(run)).encode()).hexdigest()[:8]


def arm_label(run: dict[str, Any], arm: str) -> str:
    """``mswea2 (mini-swe-agent@2.4.6)``, or ``rebuilt (the rebuilt loop of mini-swe-agent@2.4.6)``."""
    info = run["arms"][arm]
    harness = run["harnesses"][info["trained_in"]]
    return f"{arm} (the rebuilt loop of {harness})" if info["loop"] == "rebuilt" else f"{arm} ({harness})"


def pooled(group: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per trained-in row (the warm start, each arm), per evaluation harness: per-instance means over the seeds."""
    out = {WARM: {h: mean_over_seeds([r["warm_per_instance"][h] for r in group]) for h in group[0]["harnesses"]}}
    for arm in group[0]["arms"]:
        out[arm] = {h: mean_over_seeds([r["arms"][arm]["per_instance"][h] for r in group])
                    for h in group[0]["harnesses"]}
    return out


def matrix_rows(group: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Trained in x evaluated in: pooled Pass@1 [95% CI] and the gain over the warm start in points [95% CI]."""
    values, first = pooled(group), group[0]
    rows = []
    for trained, cells in values.items():
        row = {"trained in": WARM if trained == WARM else arm_label(first, trained)}
        for harness, per_instance in cells.items():
            row[f"in {first['harnesses'][harness]}"] = mean_cell(per_instance)
            if trained != WARM:
                row[f"gain in {first['harnesses'][harness]}"] = delta_cell(
                    paired_summary(values[WARM][harness], per_instance))
        rows.append(row)
    return rows


def home_rows(group: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each evaluation harness that RL also trained in: that arm minus every other arm, paired over instances
    (pooled over seeds), with the seeds' spread."""
    values, first, rows = pooled(group), group[0], []
    for harness in first["harnesses"]:
        if harness not in first["arms"]:
            continue
        for other in first["arms"]:
            if other == harness:
                continue
            paired = paired_summary(values[other][harness], values[harness][harness])
            seeds = [paired_summary(r["arms"][other]["per_instance"][harness],
                                    r["arms"][harness]["per_instance"][harness])["delta"] for r in group]
            cells = paired_cells(paired)
            rows.append({"evaluated in": first["harnesses"][harness], "trained here": arm_label(first, harness),
                         "minus trained in": arm_label(first, other), "n": paired["n"],
                         "difference [95% CI]": cells.pop("delta [95% CI]"), **cells,
                         "each seed": ", ".join(f"{100 * d:+.1f}" for d in seeds),
                         "seed sd": f"{100 * statistics.stdev(seeds):.1f}" if len(seeds) > 1 else "-",
                         "over seeds [95% CI], t-test p": seeds_cell(seeds)})
    return rows


def _slips(group: list[dict[str, Any]], trained: str, harness: str) -> dict[str, list[int]] | None:
    """Slipped edits of one cell summed over the seeds (None: records made before the matrix counted them)."""
    counts = []
    for run in group:
        habits = run.get("warm_habits") if trained == WARM else run["arms"][trained].get("habits")
        counts.append((habits or {}).get(harness))
    return summed_slips(counts)


def family_sections(group: list[dict[str, Any]]) -> Sections:
    """By task family, pooled over the seeds: each arm (A) against the warm start (B) in each harness, then in
    each harness RL also trained in, the arm trained there (A) against each other arm (B)."""
    values, first, sections = pooled(group), group[0], []
    pairs = [(arm, WARM, harness) for arm in first["arms"] for harness in first["harnesses"]]
    pairs += [(harness, other, harness) for harness in first["harnesses"] if harness in first["arms"]
              for other in first["arms"] if other != harness]
    for a, b, harness in pairs:
        label = {"evaluated in": first["harnesses"][harness], "A": a, "B": b}
        sections.append((label, family_rows(values[b][harness], values[a][harness], _slips(group, b, harness),
                                            _slips(group, a, harness), sides=("B", "A"))))
    return sections


def loop_rows(group: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per training loop: calls per RL rollout (mean over steps and seeds) and, for each harness trained in through
    the proxy, how often the rebuilt loop diverged replaying its training rollouts (turns pooled over seeds)."""
    first, rows = group[0], []
    rebuilt = next((a for a, info in first["arms"].items() if info["loop"] == "rebuilt"), None)
    for arm, info in first["arms"].items():
        calls = [d["calls_per_rollout"] for r in group for d in r["arms"][arm]["diagnostics"]
                 if d and d.get("calls_per_rollout") is not None]
        row = {"training loop": arm_label(first, arm), "calls per RL rollout": f"{statistics.mean(calls):.2f}"
               if calls else "-"}
        fids = [r.get("fidelity", {}).get(arm) for r in group]
        if rebuilt and info["loop"] == "proxy" and all(fids):
            turns, divergent = sum(f["turns"] for f in fids), sum(f["divergent_turns"] for f in fids)
            row[f"its rollouts replayed through {rebuilt}: divergent turns"] = (
                f"{divergent}/{turns} ({100 * divergent / turns:.1f}%), {sum(f['rollouts'] for f in fids)} rollouts"
                if turns else "-")
        rows.append(row)
    return rows


def csv_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    """One line per (seed, trained in, evaluated in): Pass@1 and the gain over the warm start, with the run's
    configuration (the heatmap draws the newest one: cells of different configurations are not averaged)."""
    first = {"run": run_name(run["run_dir"]), "configuration": config_label(run), "seed": run.get("seed", "")}
    rows = [first | {"trained in": WARM, "evaluated in": h, "pass_at_1": ev["pass_at_1"], "n": ev["n_samples"],
                     "gain": "", "fingerprint": run["fingerprints"][h]} for h, ev in run["warm"].items()]
    for arm, info in run["arms"].items():
        rows += [first | {"trained in": arm, "evaluated in": h, "pass_at_1": ev["pass_at_1"], "n": ev["n_samples"],
                          "gain": info["paired_vs_warm"][h]["delta"], "fingerprint": run["fingerprints"][h]}
                 for h, ev in info["after"].items()]
    return rows


def seed_cells(run: dict[str, Any]) -> dict[str, Any]:
    """A run's own Pass@1 per (trained in, evaluated in), for the per-seed table."""
    cells = {f"{WARM} in {h}": pass_cell(ev) for h, ev in run["warm"].items()}
    for arm, info in run["arms"].items():
        cells |= {f"{arm} in {h}": pass_cell(ev) for h, ev in info["after"].items()}
    return {"run": run_name(run["run_dir"]), "seed": run.get("seed", ""), **cells}


def matrix_markdown(runs: list[dict[str, Any]], kind_runs: list[dict[str, Any]] | None = None) -> str:
    sections = []
    for group in seed_groups(runs, config_key):
        seeds = ",".join(str(r.get("seed", "?")) for r in group)
        sections += [f"## Trained in x evaluated in ({len(group)} seed{'s' if len(group) > 1 else ''}: {seeds}; "
                     f"configuration {config_label(group[0])})", "",
                     pd.DataFrame(matrix_rows(group)).fillna("").to_markdown(index=False, disable_numparse=True), ""]
        home = home_rows(group)
        if home:
            sections += ["## Trained here minus trained elsewhere, per evaluation harness", "",
                         pd.DataFrame(home).to_markdown(index=False, disable_numparse=True), ""]
        sections += [*family_markdown(family_frame(family_sections(group)),
                                      "pooled over the seeds; delta = A - B, paired over the family's tasks"),
                     "## The training loops: calls per rollout, and fidelity of the rebuilt loop", "",
                     pd.DataFrame(loop_rows(group)).fillna("").to_markdown(index=False, disable_numparse=True), "",
                     REPLAY_NOTE, "",
                     "## Each seed", "",
                     pd.DataFrame([seed_cells(r) for r in group]).to_markdown(index=False, disable_numparse=True), "",
                     _notes(group), protocol_note(group, kind_runs or runs, config_key) + "\n", _provenance(group)]
    return "\n".join(sections) + "\n"


def _notes(group: list[dict[str, Any]]) -> str:
    run, rl = group[0], group[0]["rl"]
    warm = ", ".join(f"seed {r.get('seed', '?')} `{r['warm_start'].get('key', '?')}`" for r in group)
    specs = ", ".join(f"{run['harnesses'][h]} `{fp[:8]}`" for h, fp in sorted(run["fingerprints"].items()))
    return (f"Held-out tasks `{run['task_distribution']}`; train tasks `{run['train_tasks']}`; every arm "
            f"{rl['steps']} steps x {rl['tasks_per_step']} tasks x {rl['samples_per_task']} samples from its seed's "
            f"warm start (demonstrations through every harness; {warm}). Frozen specs: "
            f"{specs}. Pass@1 at temperature {run.get('eval_temperature', '?')}, 95% intervals by bootstrap over "
            "instances of the per-instance means over seeds; differences are paired over instances in points; MDE = "
            "the minimum detectable effect (alpha 0.05, power 0.8). Pooled cells and differences count every sample as "
            "graded; the per-seed cells are Pass@1, which leaves infrastructure failures (listed in each record) out "
            "of its denominator, so the two can differ by a few tenths. The pooled interval, p and MDE treat instances "
            "as the random factor (each averaged over the seeds); `over seeds` treats the training seeds as the "
            "sample instead (t interval and one-sample t-test on the seeds' own differences, n - 1 degrees of "
            "freedom): with three seeds it is much wider, and it is the one that says whether another seed would "
            "give the same. What the miniature does and does not "
            "reproduce of real harness differences: `docs/miniature.md`.\n")


def _provenance(group: list[dict[str, Any]]) -> str:
    """The command that made the runs and where each run's record is."""
    sources = ", ".join(f"`{r['run_dir']}`" for r in group)
    return (f"Command: `{command_line(group)}`, then `repro table` (each run's full configuration is in its record "
            f"under `results/runs/`). Sources: {sources}.\n")


def write_harness_matrix_tables(runs: list[dict[str, Any]], results: Path) -> list[Path]:
    """``results/<table>.md`` and ``.csv`` per table name, and the heatmap of each CSV (``.svg``) linked below."""
    written = write_named_tables(runs, results, lambda rows: matrix_markdown(rows, runs), csv_rows)
    for csv in [p for p in written if p.suffix == ".csv"]:
        svg, alt = table_plot(csv)
        md = csv.with_suffix(".md")
        md.write_text(md.read_text() + "\n" + image_link(svg, alt) + "\n")
        written.append(svg)
    return written + write_family_csvs(runs, results, lambda table_runs: [
        s for group in seed_groups(table_runs, config_key) for s in family_sections(group)])

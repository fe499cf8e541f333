"""Tables of ``before_after`` runs (the miniature reproduction): Pass@1 before and after RL on the same frozen spec,
the paired difference with its interval and tests, and hours per phase.

One table per ``table`` name (default: the experiment), one row per run, oldest first; rows whose evaluation
fingerprints differ are flagged, because their numbers are not comparable.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from repro.common.pricing import cost_cell
from repro.evaluation.paired import paired_summary
from repro.report.cells import (
    calls_summary,
    hydra_experiment,
    mean_cell,
    paired_cells,
    pass_at_k_cell,
    pass_cell,
    pct,
    run_name,
    seeds_cell,
)
from repro.report.family_sections import (
    Sections,
    family_frame,
    family_markdown,
    family_rows,
    summed_slips,
    write_family_csvs,
)
from repro.report.protocol import protocol_note, split_stream, without_seeds
from repro.report.rl_diagnostics import diagnostics_summary, write_diagnostics
from repro.report.table_files import table_file_stem, write_named_tables

PHASES = ("setup", "warm_start_demos", "warm_start_sft", "eval_before", "rl_rollouts", "rl_training", "eval_after")


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _phase_hours(run: dict[str, Any]) -> str:
    phases = run.get("compute", {}).get("phases", {})
    parts = [f"{name.replace('warm_start_', 'ws_')} {phases[name]['wall_s'] / 3600:.3f}" for name in PHASES
             if name in phases]
    return ", ".join(parts) or "-"


def _warm_cell(run: dict[str, Any]) -> str:
    warm = run.get("warm_start", {})
    how = "cached" if warm.get("cached") else f"{warm.get('demo_rollouts', '?')} demos"
    return f"{warm.get('key', '?')[:8]} ({how})"


def _rl_cell(run: dict[str, Any]) -> str:
    """steps x tasks x samples, learning rate."""
    rl, trainer = run["rl"]["config"], run.get("trainer", {})
    return (f"{rl.get('steps')}x{rl.get('tasks_per_step')}x{rl.get('samples_per_task')}, "
            f"lr {trainer.get('learning_rate', '?'):g}")


def _calls_cell(run: dict[str, Any]) -> str:
    """Calls per rollout of the held-out samples, before -> after."""
    before, after = run["before"].get("calls_histogram"), run["after"].get("calls_histogram")
    return f"{calls_summary(before)} -> {calls_summary(after)}" if before and after else "-"


def _habit_cell(run: dict[str, Any]) -> str:
    """Held-out samples with a slipped edit (``sed -n``), before -> after."""
    habits = run.get("habits") or {}
    if not habits:
        return "-"
    return f"{pct(habits['before']['share'])} -> {pct(habits['after']['share'])}"


def _weights_cell(run: dict[str, Any]) -> str:
    weights = run.get("weights_sha256") or {}
    return f"{weights['before'][:8]} -> {weights['after'][:8]}" if weights else "-"


def config_key(run: dict[str, Any]) -> tuple:
    """What makes runs repeats of one configuration (everything but the training seed): the run's whole job
    config when its ``config.yaml`` was read (warm start, filter, slip...), else the settings metrics.json holds."""
    rl = {k: v for k, v in run["rl"]["config"].items() if k != "seed"}
    trainer = {k: v for k, v in run.get("trainer", {}).items() if k != "seed"}
    job = json.dumps(without_seeds(run["run_config"].get("job", {})), sort_keys=True) if "run_config" in run else ""
    return (run["fingerprint"], run.get("loop", "proxy"), run["samples"]["weighting"], run["samples"]["mode"],
            run["train_tasks"], repr(sorted(rl.items())), repr(sorted(trainer.items())), job)


def row(run: dict[str, Any]) -> dict[str, Any]:
    paired, total = run["paired"], run.get("compute", {}).get("total", {})
    return {
        "run": run_name(run.get("run_dir", "")), "seed": run.get("seed", run["rl"]["config"].get("seed", "")),
        "changed": " ".join(changed(run)) or "-",
        "loop": run.get("loop", "proxy"), "weighting": run["samples"]["weighting"],
        "samples": run["samples"]["mode"], "RL": _rl_cell(run),
        "n": paired["n"], "Pass@1 before": pass_cell(run["before"]), "Pass@1 after": pass_cell(run["after"]),
        "pass@k before -> after": pass_at_k_cell(run), "calls per rollout before -> after": _calls_cell(run),
        "slipped edits before -> after": _habit_cell(run),
        **paired_cells(paired), "seed sd of delta": "", "over seeds [95% CI], t-test p": "",
        "McNemar p (sample 0)": _p(paired.get("mcnemar_p")),
        "weights before -> after": _weights_cell(run),
        "wall h": f"{run.get('wall_s', 0) / 3600:.2f}", "hours per phase (wall)": _phase_hours(run),
        "CPU core-h": f"{total.get('cpu_core_h', 0):.2f}", "GPU h": f"{total.get('gpu_h_allocated', 0):.2f}",
        **({"cost": cost_cell(run)} if run.get("cost") else {}),
        "warm start": _warm_cell(run), "fingerprint": run["fingerprint"][:8],
    }


def mean_over_seeds(maps: list[dict[str, float]]) -> dict[str, float]:
    """Per-instance mean over the seeds' per-instance means (the instances all seeds share)."""
    shared = set.intersection(*(set(m) for m in maps))
    return {i: sum(m[i] for m in maps) / len(maps) for i in sorted(shared)}


def pooled_row(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The seeds of one configuration pooled: per-instance means over seeds and samples, the paired delta over
    instances (bootstrap interval, sign-flip p, MDE) and the spread of the seeds' own deltas."""
    if len(runs) < 2 or not all("per_instance" in r for r in runs):
        return None
    before = mean_over_seeds([r["per_instance"]["before"] for r in runs])
    after = mean_over_seeds([r["per_instance"]["after"] for r in runs])
    paired = paired_summary(before, after)
    deltas = [r["paired"]["delta"] for r in runs]
    sd = statistics.stdev(deltas)

    total_cpu = sum(r.get("compute", {}).get("total", {}).get("cpu_core_h", 0) for r in runs)
    return {**{key: "" for key in row(runs[0])},
            "run": f"pooled ({len(runs)} seeds)", "seed": ",".join(str(r.get("seed", "?")) for r in runs),
            "loop": runs[0].get("loop", "proxy"), "weighting": runs[0]["samples"]["weighting"],
            "samples": runs[0]["samples"]["mode"], "RL": _rl_cell(runs[0]), "n": paired["n"],
            "Pass@1 before": mean_cell(before), "Pass@1 after": mean_cell(after), **paired_cells(paired),
            "seed sd of delta": f"{100 * sd:.1f}", "over seeds [95% CI], t-test p": seeds_cell(deltas),
            "wall h": f"{sum(r.get('wall_s', 0) for r in runs) / 3600:.2f}", "CPU core-h": f"{total_cpu:.2f}",
            "fingerprint": runs[0]["fingerprint"][:8]}


def seed_groups(runs: list[dict[str, Any]], key: Callable[[dict[str, Any]], tuple]) -> list[list[dict[str, Any]]]:
    """Runs grouped by configuration ``key`` (in order of first appearance), each group ordered by seed."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault(key(run), []).append(run)
    return [sorted(g, key=lambda r: (str(r.get("seed", "")), r.get("started_at", 0))) for g in groups.values()]


def _slips(runs: list[dict[str, Any]], side: str) -> dict[str, list[int]] | None:
    return summed_slips([(r.get("habits") or {}).get(side) for r in runs])


def family_sections(group: list[dict[str, Any]]) -> Sections:
    """One configuration's family rows: each seed's, then pooled over the seeds (per-instance means), last; each
    labelled with the configuration's overrides and the task stream it scored (a default that moved to a new split
    has no overrides to tell it apart)."""
    if not all("per_instance" in r for r in group):
        return []
    which = {"changed": " ".join(changed(group[0])) or "-", "held out": split_stream(group[0]) or "-"}
    sections = [({"run": run_name(r["run_dir"]), "seed": r.get("seed", ""), **which},
                 family_rows(r["per_instance"]["before"], r["per_instance"]["after"], _slips([r], "before"),
                             _slips([r], "after"))) for r in group]
    if len(group) > 1:
        before = mean_over_seeds([r["per_instance"]["before"] for r in group])
        after = mean_over_seeds([r["per_instance"]["after"] for r in group])
        label = {"run": f"pooled ({len(group)} seeds)", "seed": ",".join(str(r.get("seed", "?")) for r in group),
                 **which}
        sections.append((label, family_rows(before, after, _slips(group, "before"), _slips(group, "after"))))
    return sections


def all_family_sections(runs: list[dict[str, Any]]) -> Sections:
    """Every configuration's family sections (:func:`family_sections`), in order."""
    return [s for group in seed_groups(runs, config_key) for s in family_sections(group)]


def table_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per configuration (in order of first appearance): its runs by seed, then their pooled row."""
    rows = []
    for group in seed_groups(runs, config_key):
        rows += [row(r) for r in group]
        pooled = pooled_row(group)
        if pooled:
            rows.append(pooled)
    if any("cost" in r for r in rows):  # priced runs (pricing.*): every row gets the column
        for r in rows:
            r.setdefault("cost", "-")
    return rows


def _is_seed_or_name(override: str) -> bool:
    return override.split("=", 1)[0].lstrip("+~") in ("experiment", "seed", "run.name")


def changed(run: dict[str, Any]) -> list[str]:
    """The run's command-line overrides other than the experiment, the seed and the run name (None: unknown)."""
    return [o for o in run.get("overrides") or [] if not _is_seed_or_name(o)]


def ablation_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each configuration against the default one on the same evaluation (the runs whose only overrides are the
    experiment and seed, with the same fingerprint: a default that moved to a new test split is the reference of the
    ablations run there): Pass@1 after RL, both pooled over the seeds they share (per-instance means), paired over
    instances."""
    groups = seed_groups([r for r in runs if "overrides" in r], config_key)
    defaults: dict[str, list[dict[str, Any]]] = {}
    for group in groups:
        if not changed(group[0]):
            defaults.setdefault(group[0]["fingerprint"], group)
    rows = []
    for group in groups:
        default = defaults.get(group[0]["fingerprint"])
        if default is None or group is default:
            continue
        reference = {str(r.get("seed")): r for r in default}
        pairs = [(reference[str(r.get("seed"))], r) for r in group if str(r.get("seed")) in reference]
        if not pairs:
            continue
        base = mean_over_seeds([a["per_instance"]["after"] for a, _ in pairs])
        other = mean_over_seeds([b["per_instance"]["after"] for _, b in pairs])
        paired = paired_summary(base, other)
        rows.append({"configuration": " ".join(changed(group[0])),
                     "seeds": ",".join(str(b.get("seed")) for _, b in pairs), "n": paired["n"],
                     "Pass@1 after, default": mean_cell(base), "Pass@1 after, this": mean_cell(other),
                     **{("this - default [95% CI]" if k == "delta [95% CI]" else k): v
                        for k, v in paired_cells(paired).items()}})
    return rows


def probe_summary(runs: list[dict[str, Any]]) -> pd.DataFrame:
    """One line per run that probed its RL tasks: the outcome classes of the pool, what was kept, pass@k for
    k = 1..K of the warm start on the pool (the headroom sharpening can turn into Pass@1) and calls per probe."""
    lines = []
    for run in runs:
        probe = run.get("probe")
        if not probe:
            continue
        counts, curve = probe["counts"], probe["pass_at_k"]
        lines.append({
            "run": run.get("name") or run_name(run.get("run_dir", "")), "seed": run.get("seed", ""),
            "pool x k": f"{counts['mixed'] + counts['all_fail'] + counts['all_pass']} x {probe['config']['k']}",
            "mixed / all-fail / all-pass": f"{counts['mixed']} / {counts['all_fail']} / {counts['all_pass']}",
            "kept (all-fail)": _kept(probe),
            "pass@k, k = 1..K": " ".join(f"{100 * curve[k]:.0f}" for k in sorted(curve, key=int)),
            "calls per probe": calls_summary(probe.get("calls_per_rollout") or {}),
            "reused": "yes" if probe.get("reused") else "no",
        })
    return pd.DataFrame(lines)


def _kept(probe: dict[str, Any]) -> str:
    """``67 (11)``: kept tasks (all-fail among them); a run that fell back says what the filter kept and the rule."""
    counts, fallback = probe["counts"], probe.get("fallback")
    text = f"{counts['kept']} ({counts['kept_all_fail']})"
    if fallback:
        text += f"; < min {fallback['min_tasks']}: {fallback['rule']}, all {fallback['tasks']}"
    return text


def _distinct(runs: list[dict[str, Any]], key: str) -> str:
    """The distinct values of ``key`` over the runs, in order, each with the runs it is for when they differ."""
    values = list(dict.fromkeys(str(r.get(key, "?")) for r in runs))
    if len(values) == 1:
        return f"`{values[0]}`"
    return "; ".join(f"`{v}` ({', '.join(run_name(r.get('run_dir', '')) for r in runs if str(r.get(key)) == v)})"
                     for v in values)


def run_markdown(runs: list[dict[str, Any]], kind_runs: list[dict[str, Any]] | None = None) -> str:
    """The markdown table for ``runs`` (all of one table), with the diagnostics summary, how to read it and what
    its records say of the protocol (``kind_runs``: every before/after run, for the validation runs)."""
    frame = pd.DataFrame(table_rows(runs))
    lines = [frame.to_markdown(index=False, disable_numparse=True), ""]
    fingerprints = {r["fingerprint"] for r in runs}
    if len(fingerprints) > 1:
        lines.append(f"**Warning**: {len(fingerprints)} different evaluation fingerprints; rows are not comparable.")
    first = runs[0]
    held_out, train = _distinct(runs, "task_distribution"), _distinct(runs, "train_tasks")
    lines.append(f"Held-out tasks: {held_out}; train tasks: {train}. "
                 f"Pass@1 = mean over k={first['before'].get('k', 1)} samples per task at temperature "
                 f"{first.get('eval_temperature', '?')}, 95% Wilson intervals (pooled rows: bootstrap over "
                 "instances); delta = paired mean difference over instances in points (bootstrap interval); MDE = "
                 "minimum detectable effect in points of a paired two-sided test at alpha 0.05 with 80% power, "
                 "given the observed per-instance differences; sign-flip = paired randomization test on "
                 "per-instance means; McNemar = exact test on solved/unsolved pairs of sample 0. A pooled row "
                 "averages each instance over the seeds (and samples) before pairing; seed sd is the standard "
                 "deviation of the seeds' own deltas, and `over seeds` their mean with a t interval and one-sample "
                 "t-test (the seeds as the sample: would another seed gain as much). Weights: sha256 prefixes of the "
                 "warm start and the trained policy.")
    seeds = sorted({str(r.get("seed")) for r in runs if r.get("seed") is not None}, key=lambda x: (len(x), x))
    if seeds:
        lines += ["", f"Rebuild: `repro run -m experiment={hydra_experiment(first)} seed={','.join(seeds)}` (plus the "
                      "overrides in each run's `overrides.txt`), then `repro table`."]
    groups = [family_sections(g) for g in seed_groups(runs, config_key)]
    shown = [sections[-1] for sections in groups if sections]
    if shown:
        lines += ["", *family_markdown(family_frame(shown), "pooled over each configuration's seeds; every seed in "
                                       f"`{table_file_stem(first.get('table') or first['experiment'])}_families.csv`")]
    lines += ["", protocol_note(runs, kind_runs or runs, config_key)]
    ablations = ablation_rows(runs)
    if ablations:
        lines += ["", "### Against the default configuration (Pass@1 after RL, seeds paired, instances paired)", "",
                  pd.DataFrame(ablations).to_markdown(index=False, disable_numparse=True)]
    probes = probe_summary(runs)
    if len(probes):
        lines += ["", "### RL task filter: the warm start's probes of the RL pool (pass@k in %)", "",
                  probes.to_markdown(index=False, disable_numparse=True)]
    summary = diagnostics_summary(runs)
    if len(summary):
        lines += ["", "### RL diagnostics per run (every step in the companion `_diagnostics` files)", "",
                  summary.to_markdown(index=False, disable_numparse=True)]
    return "\n".join(lines) + "\n"


def write_before_after_tables(runs: list[dict[str, Any]], results: Path) -> list[Path]:
    """``results/<table>.md`` and ``.csv`` per table name, and ``<table>_diagnostics.md`` / ``.csv``: every RL
    step of every run."""
    written = write_named_tables(runs, results, lambda rows: run_markdown(rows, runs), table_csv_rows=table_rows)
    return written + write_family_csvs(runs, results, all_family_sections) + write_diagnostics(runs, results)



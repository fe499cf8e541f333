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

from repro.evaluation.metrics import bootstrap_interval
from repro.evaluation.paired import paired_summary
from repro.pricing import cost_cell
from repro.report.eval_table import pct

PHASES = ("setup", "warm_start_demos", "warm_start_sft", "eval_before", "rl_rollouts", "rl_training", "eval_after")


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def pass_cell(ev: dict[str, Any]) -> str:
    """``Pass@1 [low, high]`` of one evaluation."""
    return f"{pct(ev['pass_at_1'])} [{pct(ev['ci']['low'])}, {pct(ev['ci']['high'])}]"


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


def delta_cell(paired: dict[str, Any]) -> str:
    """The paired difference and its interval, in points (``+4.5 [+1.2, +7.9]``)."""
    return (f"{100 * paired['delta']:+.1f} [{100 * paired['delta_low']:+.1f}, {100 * paired['delta_high']:+.1f}]")


def mde_cell(paired: dict[str, Any]) -> str:
    """The minimum detectable effect in points ('-' when unknown)."""
    return "-" if paired.get("mde") is None else f"{100 * paired['mde']:.1f}"


def pass_at_k_cell(run: dict[str, Any]) -> str:
    """``pass@k before -> after`` at the largest k both evaluations report."""
    before, after = run["before"].get("pass_at_k") or {}, run["after"].get("pass_at_k") or {}
    common = sorted(set(before) & set(after), key=int)
    if not common or common[-1] == "1":
        return "-"
    k = common[-1]
    return f"@{k}: {pct(before[k])} -> {pct(after[k])}"


def calls_summary(histogram: dict[str, int]) -> str:
    """``2.96 (>=3: 97%)``: mean model calls per rollout and the share with three or more."""
    total = sum(histogram.values())
    if not total:
        return "-"
    mean = sum(int(n) * c for n, c in histogram.items()) / total
    multi = sum(c for n, c in histogram.items() if int(n) >= 3) / total
    return f"{mean:.2f} (>=3: {multi:.0%})"


def merged_histogram(histograms: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for histogram in histograms:
        for n, c in histogram.items():
            out[n] = out.get(n, 0) + c
    return dict(sorted(out.items(), key=lambda item: int(item[0])))


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


def without_seeds(node: Any) -> Any:
    """A config tree without its ``seed`` keys (the training seed reaches the model, SFT, RL, filter...)."""
    if isinstance(node, dict):
        return {k: without_seeds(v) for k, v in node.items() if k != "seed"}
    return [without_seeds(v) for v in node] if isinstance(node, list) else node


def run_name(run_dir: str) -> str:
    """A run's name in a table: its directory, with the sweep's when it is a multirun job (``<time>/0``)."""
    path = Path(run_dir)
    return f"{path.parent.name}/{path.name}" if path.name.isdigit() else path.name


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
        "delta [95% CI]": delta_cell(paired), "MDE": mde_cell(paired),
        "sign-flip p": _p(paired.get("sign_flip_p")), "McNemar p (sample 0)": _p(paired.get("mcnemar_p")),
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


def mean_cell(values: dict[str, float]) -> str:
    """``44.5% [41.2%, 47.6%]``: the mean of per-instance values with its bootstrap interval over instances."""
    low, high = bootstrap_interval(list(values.values()))
    return f"{pct(statistics.fmean(values.values()))} [{pct(low)}, {pct(high)}]"


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
            "Pass@1 before": mean_cell(before), "Pass@1 after": mean_cell(after),
            "delta [95% CI]": f"{delta_cell(paired)}, seed sd {100 * sd:.1f}", "MDE": mde_cell(paired),
            "sign-flip p": _p(paired["sign_flip_p"]),
            "wall h": f"{sum(r.get('wall_s', 0) for r in runs) / 3600:.2f}", "CPU core-h": f"{total_cpu:.2f}",
            "fingerprint": runs[0]["fingerprint"][:8]}


def seed_groups(runs: list[dict[str, Any]], key: Callable[[dict[str, Any]], tuple]) -> list[list[dict[str, Any]]]:
    """Runs grouped by configuration ``key`` (in order of first appearance), each group ordered by seed."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault(key(run), []).append(run)
    return [sorted(g, key=lambda r: (str(r.get("seed", "")), r.get("started_at", 0))) for g in groups.values()]


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


def diagnostics_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Per RL step: what :func:`repro.rl.steps.step_diagnostics` recorded, with the run and seed."""
    steps = run.get("diagnostics") or [h.get("diagnostics") for h in run["rl"].get("history", [])]
    name = run.get("name") or run_name(run.get("run_dir", ""))
    return [{"run": name, "seed": run.get("seed", ""), **d} for d in steps if d]


def diagnostics_summary(runs: list[dict[str, Any]]) -> pd.DataFrame:
    """One line per run: reward first -> last step, mean mixed-group share and clip fraction, entropy first ->
    last, mean calls per rollout, and the largest first-update |log ratio| (the on-policy check)."""
    lines = []
    for run in runs:
        steps = diagnostics_rows(run)
        if not steps:
            continue
        lines.append({
            "run": steps[0]["run"], "seed": steps[0]["seed"], "steps": len(steps),
            "reward first -> last": f"{steps[0]['reward_mean']:.3f} -> {steps[-1]['reward_mean']:.3f}",
            "mixed groups": f"{statistics.fmean(s['mixed_group_share'] for s in steps):.0%}",
            "clip fraction": f"{statistics.fmean(s['clip_fraction'] for s in steps):.2%}",
            "entropy first -> last": f"{steps[0]['entropy']:.3f} -> {steps[-1]['entropy']:.3f}",
            "calls per rollout": _rl_calls(steps),
            "max first-update abs log ratio": f"{max(s['log_ratio_first_max'] for s in steps):.1e}",
        })
    return pd.DataFrame(lines)


def _is_seed_or_name(override: str) -> bool:
    return override.split("=", 1)[0].lstrip("+~") in ("experiment", "seed", "run.name")


def changed(run: dict[str, Any]) -> list[str]:
    """The run's command-line overrides other than the experiment, the seed and the run name (None: unknown)."""
    return [o for o in run.get("overrides") or [] if not _is_seed_or_name(o)]


def ablation_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each configuration against the default one (the runs whose only overrides are the experiment and seed):
    Pass@1 after RL, both pooled over the seeds they share (per-instance means), paired over instances."""
    groups = seed_groups([r for r in runs if "overrides" in r], config_key)
    defaults = [g for g in groups if not changed(g[0])]
    if not defaults:
        return []
    reference = {str(r.get("seed")): r for r in defaults[0]}
    rows = []
    for group in groups:
        if group is defaults[0] or group[0]["fingerprint"] != defaults[0][0]["fingerprint"]:
            continue
        pairs = [(reference[str(r.get("seed"))], r) for r in group if str(r.get("seed")) in reference]
        if not pairs:
            continue
        base = mean_over_seeds([a["per_instance"]["after"] for a, _ in pairs])
        other = mean_over_seeds([b["per_instance"]["after"] for _, b in pairs])
        paired = paired_summary(base, other)
        rows.append({"configuration": " ".join(changed(group[0])),
                     "seeds": ",".join(str(b.get("seed")) for _, b in pairs), "n": paired["n"],
                     "Pass@1 after, default": mean_cell(base), "Pass@1 after, this": mean_cell(other),
                     "this - default [95% CI]": delta_cell(paired), "MDE": mde_cell(paired),
                     "sign-flip p": _p(paired["sign_flip_p"])})
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


def _rl_calls(steps: list[dict[str, Any]]) -> str:
    """Calls per RL rollout over all steps, with the distribution when the steps recorded it."""
    histogram = merged_histogram([s.get("calls_histogram") or {} for s in steps])
    if not histogram:
        return f"{statistics.fmean(s['calls_per_rollout'] for s in steps):.2f}"
    total = sum(histogram.values())
    shares = ", ".join(f"{n}: {c / total:.0%}" for n, c in histogram.items())
    return f"{calls_summary(histogram)}; {shares}"


def hydra_experiment(run: dict[str, Any]) -> str:
    """The experiment config a run was started with (its ``experiment=`` override), else its table's name."""
    chosen = [o.split("=", 1)[1] for o in run.get("overrides") or [] if o.startswith("experiment=")]
    return chosen[0] if chosen else run["experiment"]


def run_markdown(runs: list[dict[str, Any]]) -> str:
    """The markdown table for ``runs`` (all of one table), with the diagnostics summary and how to read it."""
    frame = pd.DataFrame(table_rows(runs))
    lines = [frame.to_markdown(index=False, disable_numparse=True), ""]
    fingerprints = {r["fingerprint"] for r in runs}
    if len(fingerprints) > 1:
        lines.append(f"**Warning**: {len(fingerprints)} different evaluation fingerprints; rows are not comparable.")
    first = runs[0]
    lines.append(f"Held-out tasks: `{first['task_distribution']}`; train tasks: `{first['train_tasks']}`. "
                 f"Pass@1 = mean over k={first['before'].get('k', 1)} samples per task at temperature "
                 f"{first.get('eval_temperature', '?')}, 95% Wilson intervals (pooled rows: bootstrap over "
                 "instances); delta = paired mean difference over instances in points (bootstrap interval); MDE = "
                 "minimum detectable effect in points of a paired two-sided test at alpha 0.05 with 80% power, "
                 "given the observed per-instance differences; sign-flip = paired randomization test on "
                 "per-instance means; McNemar = exact test on solved/unsolved pairs of sample 0. A pooled row "
                 "averages each instance over the seeds (and samples) before pairing; seed sd is the standard "
                 "deviation of the seeds' own deltas. Weights: sha256 prefixes of the warm start and the trained "
                 "policy.")
    seeds = sorted({str(r.get("seed")) for r in runs if r.get("seed") is not None}, key=lambda x: (len(x), x))
    if seeds:
        lines += ["", f"Rebuild: `repro run -m experiment={hydra_experiment(first)} seed={','.join(seeds)}` (plus the "
                      "overrides in each run's `overrides.txt`), then `repro table`."]
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


def by_table(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Runs per table name (a run's ``table``, else its experiment), in order."""
    tables: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        tables.setdefault(run.get("table") or run["experiment"], []).append(run)
    return tables


def write_named_tables(runs: list[dict[str, Any]], results: Path, markdown: Callable[[list[dict[str, Any]]], str],
                       csv_rows: Callable[[dict[str, Any]], list[dict[str, Any]]]) -> list[Path]:
    """``results/<table>.md`` (``markdown`` of the table's runs) and ``.csv`` (``csv_rows`` of each run), per table
    name (a run's ``table``, else its experiment)."""
    written = []
    for name, rows in by_table(runs).items():
        md, csv = results / f"{name}.md", results / f"{name}.csv"
        md.write_text(f"# {name}\n\n" + markdown(rows))
        pd.DataFrame([r for run in rows for r in csv_rows(run)]).to_csv(csv, index=False)
        written += [md, csv]
    return written


def write_before_after_tables(runs: list[dict[str, Any]], results: Path) -> list[Path]:
    """``results/<table>.md`` and ``.csv`` per table name, and ``<table>_diagnostics.md`` / ``.csv``: every RL
    step of every run."""
    written = write_named_tables(runs, results, run_markdown, lambda run: [row(run)])
    return written + write_diagnostics(runs, results)


def write_diagnostics(runs: list[dict[str, Any]], results: Path) -> list[Path]:
    """``results/<table>_diagnostics.md`` and ``.csv`` per table name (runs without diagnostics are left out)."""
    from repro.report.table_plots import diagnostics_link_line, image_link, table_plot

    written = []
    for name, group in by_table(runs).items():
        frame = pd.DataFrame([r for run in group for r in diagnostics_rows(run)])
        if frame.empty:
            continue
        md, csv = results / f"{name}_diagnostics.md", results / f"{name}_diagnostics.csv"
        frame.to_csv(csv, index=False)
        svg, alt = table_plot(csv)  # the plot of the CSV's rows
        link = image_link(svg, alt)
        md.write_text(f"# {name}: RL diagnostics per step\n\n" + DIAGNOSTICS_NOTE + "\n\n" + link + "\n\n"
                      + frame.to_markdown(index=False, floatfmt=".4g") + "\n")
        table_md = results / f"{name}.md"
        if table_md.exists():
            table_md.write_text(table_md.read_text() + f"\n{diagnostics_link_line(link, md)}\n")
        written += [md, csv, svg]
    return written


DIAGNOSTICS_NOTE = (
    "reward_mean: share of resolved rollouts; mixed_group_share: groups (one task's samples) with both outcomes, "
    "the only ones GRPO learns from; clip_fraction: sampled tokens whose ratio was clipped in the updates after "
    "the first; entropy: mean entropy (nats) of the sampling policy on its sampled tokens; calls_per_rollout: "
    "model calls per rollout; log_ratio_first_max: max |log ratio| between the trainer's and the recorded "
    "sampling logprobs before the step's first update (the on-policy check, bounded by "
    "trainer.on_policy_log_ratio_max); log_ratio_max: the same over all updates of the step.")

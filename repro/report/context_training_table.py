"""``results/context_training.md`` and ``.csv``: RL on rollouts that the harness's context management branches, per
arm pooled over its RL seeds, each against the warm start and the arms against the ``rollout`` arm
(:mod:`repro.experiments.context_training`). Seeds are pooled by averaging each held-out instance over them before
pairing (the miniature's rule); per-seed values are in the CSV."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from repro.evaluation.paired import paired_summary
from repro.report.before_after import mean_over_seeds
from repro.report.cells import command_line, hydra_experiment, mean_cell, paired_cells, pct, seeds_cell
from repro.report.protocol import protocol_note
from repro.report.table_files import write_named_tables

Run = dict[str, Any]
BASE_ARM = "rollout"  # the package's default weighting, with the harness's context management on
WARM = "warm start"


def config_key(run: Run) -> tuple:
    return (run["fingerprint"], run["train_tasks"], repr(run["window"]), repr(sorted(run["rl"].items())))


def arm_seeds(run: Run) -> dict[str, list[Run]]:
    """The run's arms by name, each a list over its RL seeds (in seed order)."""
    out: dict[str, list[Run]] = {}
    for arm in sorted(run["arms"], key=lambda a: a["seed"]):
        out.setdefault(arm["arm"], []).append(arm)
    return out


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def arm_row(run: Run, name: str, seeds: list[Run]) -> dict[str, Any]:
    """One arm pooled over its seeds: Pass@1, its gain over the warm start, how training branched."""
    pooled = mean_over_seeds([a["per_instance"] for a in seeds])
    paired = paired_summary(run["warm_per_instance"], pooled)
    cells = paired_cells(paired)
    deltas = [a["paired_vs_warm"]["delta"] for a in seeds]
    train, ev = [a["training"] for a in seeds], [a["context"] for a in seeds]
    return {"arm": name, "weighting": seeds[0]["weighting"], "condenser (training)": seeds[0]["condenser"],
            "seeds": ",".join(str(a["seed"]) for a in seeds), "Pass@1": mean_cell(pooled),
            "gain [95% CI]": cells["delta [95% CI]"], "MDE": cells["MDE"], "sign-flip p": cells["sign-flip p"],
            "each seed": ", ".join(f"{100 * d:+.1f}" for d in deltas), "over seeds": seeds_cell(deltas),
            "train rows / rollout": f"{_mean([t['rows_mean'] for t in train]):.2f}",
            "train several rows": pct(_mean([t['several_rows'] for t in train])),
            "train refused": pct(_mean([t['refused'] for t in train])),
            "train ended on refusal": pct(_mean([t['ended_on_refusal'] for t in train])),
            "eval rows / rollout": f"{_mean([e['rows_mean'] for e in ev]):.2f}",
            "eval several rows": pct(_mean([e['several_rows'] for e in ev])),
            "eval refused": pct(_mean([e['refused'] for e in ev])),
            "eval context_exceeded": pct(_mean([e['context_exceeded'] for e in ev]))}


def warm_row(run: Run) -> dict[str, Any]:
    ev = run["warm_context"]
    return {"arm": WARM, "Pass@1": mean_cell(run["warm_per_instance"]), "eval rows / rollout": f"{ev['rows_mean']:.2f}",
            "eval several rows": pct(ev["several_rows"]), "eval refused": pct(ev["refused"]),
            "eval context_exceeded": pct(ev["context_exceeded"])}


def contrast_row(name: str, arm: list[Run], base: list[Run]) -> dict[str, Any]:
    """``name`` minus the ``rollout`` arm, paired over instances pooled over the seeds both ran, and seed by seed."""
    shared = sorted({a["seed"] for a in arm} & {b["seed"] for b in base})
    a_by, b_by = {a["seed"]: a for a in arm}, {b["seed"]: b for b in base}
    pooled = paired_summary(mean_over_seeds([b_by[s]["per_instance"] for s in shared]),
                            mean_over_seeds([a_by[s]["per_instance"] for s in shared]))
    deltas = [paired_summary(b_by[s]["per_instance"], a_by[s]["per_instance"])["delta"] for s in shared]
    cells = paired_cells(pooled)
    same = sum(a_by[s].get("weights_sha256") == b_by[s].get("weights_sha256") is not None for s in shared)
    return {"comparison": f"{name} minus {BASE_ARM}", "seeds": ",".join(map(str, shared)), "n": pooled["n"],
            "same trained weights": f"{same} of {len(shared)} seeds",
            "difference [95% CI]": cells["delta [95% CI]"], "MDE": cells["MDE"], "sign-flip p": cells["sign-flip p"],
            "each seed": ", ".join(f"{100 * d:+.1f}" for d in deltas), "over seeds": seeds_cell(deltas)}


def md_table(rows: list[dict[str, Any]]) -> str:
    """Rows as a markdown table (columns: the union, the longest row's order first; '-' where a row has none)."""
    cols = list(dict.fromkeys(k for r in sorted(rows, key=len, reverse=True) for k in r))
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "-")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def window_sentence(run: Run) -> str:
    """Where the rollouts met their context: the probed window W, or the model's own context."""
    w = run["window"]
    probe = (f"measured with room on {w['probe_rollouts']} RL tasks (never held-out ones; "
             f"{w['probe_calls_mean']:.1f} calls a rollout there)")
    if w.get("window") is None:
        growth = "-" if w.get("step_growth_median") is None else f"{w['step_growth_median']:.0f}"
        return (f"In {run['harness']} with the model's own context (no served window: the harness compacts by its "
                f"own count); the warm start's longest first prompt {w['first_prompt_max']:,} tokens and its median "
                f"growth a call {growth}, {probe}.")
    return (f"In {run['harness']} at a served window W = {w['window']:,} tokens: the warm start's longest first "
            f"prompt ({w['first_prompt_max']:,}) + the forced `max_tokens` ({w['max_tokens']}) + "
            f"{w['window_steps']} x its median growth of the prompt a call ({w['step_growth_median']:.0f}), {probe}.")


def run_section(run: Run, kind_runs: list[Run]) -> str:
    """The run's arms, its contrasts, how it was set up and where its numbers come from."""
    arms, rl = arm_seeds(run), run["rl"]
    contrasts = [contrast_row(n, s, arms[BASE_ARM]) for n, s in arms.items() if n != BASE_ARM and BASE_ARM in arms]
    skipped = run.get("skipped_for_budget") or []
    w = run["window"]
    where = "the model's own context" if w.get("window") is None else f"a served window of {w['window']:,} tokens"
    parts = [f"## `{hydra_experiment(run)}`: {where}, `{run['task_distribution']}`", "", window_sentence(run) + (
        f" Every arm is {rl['steps']} RL steps x {rl['tasks_per_step']} tasks x {rl['samples_per_task']} samples "
        f"from one warm start (`{run['warm_start'].get('key', '?')}`), one run per RL seed; every policy is "
        f"evaluated with the harness's context management on, on `{run['task_distribution']}`."),
        "",
        md_table([warm_row(run)] + [arm_row(run, n, s) for n, s in arms.items()]),
        "",
        md_table(contrasts) if contrasts else "",
        "",
        "`same trained weights`: seeds where both arms ended with bit-identical weights (sha256): where no "
        "training rollout has more than one row, or those that do carry no advantage, the two weightings give the"
        " same update. `weighting`: `rollout` (a rollout's rows share one rollout's weight, by sampled tokens) or"
        " `fragment` (each row counts as an episode). `train rows / rollout`: training rows (prefix chains) per "
        "training rollout; `several rows`: the share split into more than one; `refused`: the share with a call "
        "refused as longer than W; `ended on refusal`: the share whose last policy call was refused (reward 0, "
        "rows kept: the default `context_rule`). Pooled cells average each instance over the seeds before "
        "pairing; `over seeds` treats the RL seeds as the sample (t interval and t-test over the seeds' own "
        "differences). The seeds share one warm start, so they measure the RL draw, not the warm start's. MDE: "
        "alpha 0.05, power 0.8.",
    ]
    if skipped:
        parts += ["", f"Not run (the run's `context.budget_s` passed first): {', '.join(skipped)}."]
    parts += ["", protocol_note([run], kind_runs, config_key), "",
              f"Command: `{command_line([with_seed(run)])}`, then `repro table`. Source: `{run['run_dir']}`."]
    return "\n".join(parts) + "\n"


def with_seed(run: Run) -> Run:
    """The run with its warm start's ``seed`` (records made before it was written: the config's)."""
    return run if "seed" in run else run | {"seed": (run.get("run_config") or {}).get("seed", "?")}


def context_training_markdown(runs: list[Run], kind_runs: list[Run] | None = None) -> str:
    """Each run's section, newest first."""
    return "\n".join(run_section(run, kind_runs or runs) for run in reversed(runs))


def csv_rows(run: Run) -> list[dict[str, Any]]:
    """A row per arm and seed: Pass@1, its difference from the warm start, how training branched."""
    rows = [{"run": run["run_dir"], "arm": WARM, "seed": "", "pass_at_1": run["warm"]["pass_at_1"],
             "window": run["window"]["window"], **{f"eval_{k}": v for k, v in run["warm_context"].items()}}]
    for a in run["arms"]:
        rows.append({"run": run["run_dir"], "arm": a["arm"], "seed": a["seed"], "weighting": a["weighting"],
                     "condenser": a["condenser"], "pass_at_1": a["after"]["pass_at_1"],
                     "delta_vs_warm": a["paired_vs_warm"]["delta"], "mde": a["paired_vs_warm"].get("mde"),
                     "window": run["window"]["window"], **{f"train_{k}": v for k, v in a["training"].items()},
                     **{f"eval_{k}": v for k, v in a["context"].items()}})
    return rows


def write_context_training_tables(runs: list[Run], results: Path) -> list[Path]:
    """``results/context_training.md`` and ``.csv``."""
    return write_named_tables(runs, results, lambda rows: context_training_markdown(rows, runs), csv_rows)

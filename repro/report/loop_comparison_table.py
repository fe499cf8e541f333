"""Tables of ``loop_comparison`` runs: RL through the real harness vs the rebuilt loop, and the fidelity replays."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pandas as pd

from repro.evaluation.paired import paired_summary
from repro.report import cells
from repro.report.before_after import mean_over_seeds, seed_groups
from repro.report.family_sections import (
    Sections,
    family_frame,
    family_markdown,
    family_rows,
    summed_slips,
    write_family_csvs,
)
from repro.report.protocol import protocol_note
from repro.report.rl_diagnostics import diagnostics_summary, write_diagnostics
from repro.report.table_files import write_named_tables
from repro.report.tokenizer_drift_table import TOKENIZER_NAMES

ARM_PHASES = ("rl_rollouts", "rl_training", "eval_after")


def _hours(compute: dict[str, Any]) -> str:
    phases = compute.get("phases", {})
    return ", ".join(f"{p} {phases[p]['wall_s'] / 3600:.3f}" for p in ARM_PHASES if p in phases) or "-"


def _schedule(run: dict[str, Any]) -> str:
    rl = run["rl"]
    return f"{rl['steps']}x{rl['tasks_per_step']}x{rl['samples_per_task']}, lr {run['trainer']['learning_rate']:g}"


def _comparison(run: dict[str, Any], arm: str, n: int, before: str, after: str,
                paired: dict[str, Any], **rest: str) -> dict[str, Any]:
    return {"run": cells.run_name(run["run_dir"]), "seed": rest.pop("seed", run.get("seed", "")), "RL rollouts by": arm,
            "RL": _schedule(run), "n": n, "Pass@1 before": before, "Pass@1 after": after,
            **cells.paired_cells(paired), **rest}


def arm_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per arm of one run, then the paired difference between the arms."""
    rows = []
    for kind, arm in run["arms"].items():
        paired, total = arm["paired_vs_before"], arm["compute"].get("total", {})
        weights = arm.get("weights_sha256")
        rows.append(_comparison(run, kind, paired["n"], cells.pass_cell(run["before"]), cells.pass_cell(arm["after"]),
                                paired, **{"pass@k before -> after": cells.pass_at_k_cell({"before": run["before"],
                                                                                       "after": arm["after"]}),
                                           "calls per rollout after": cells.calls_summary(
                                               arm["after"].get("calls_histogram") or {}),
                                           "weights after": weights[:8] if weights else "-",
                                           "hours (wall)": _hours(arm["compute"]),
                                           "CPU core-h": f"{total.get('cpu_core_h', 0):.2f}"}))
    between = run.get("rebuilt_minus_proxy")
    if between:
        rows.append(_comparison(run, "rebuilt - proxy", between["n"], "", "", between))
    return rows


def _spread(deltas: list[float]) -> dict[str, str]:
    return {"seed sd of delta": f"{100 * statistics.stdev(deltas):.1f}",
            "over seeds [95% CI], t-test p": cells.seeds_cell(deltas)}


def pooled_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Seeds of one configuration pooled per arm (per-instance means over seeds), and rebuilt - proxy pooled."""
    if len(runs) < 2 or not all("per_instance_before" in r for r in runs):
        return []
    seeds, rows = ",".join(str(r.get("seed", "?")) for r in runs), []
    label = f"pooled ({len(runs)} seeds)"
    before = mean_over_seeds([r["per_instance_before"] for r in runs])
    after = {kind: mean_over_seeds([r["arms"][kind]["per_instance"] for r in runs]) for kind in runs[0]["arms"]}
    for kind, values in after.items():
        paired = paired_summary(before, values)
        deltas = [r["arms"][kind]["paired_vs_before"]["delta"] for r in runs]
        rows.append(_comparison(runs[0], kind, paired["n"], cells.mean_cell(before), cells.mean_cell(values), paired,
                                seed=seeds, **_spread(deltas)) | {"run": label})
    if {"proxy", "rebuilt"} <= set(after):
        paired = paired_summary(after["proxy"], after["rebuilt"])
        deltas = [r["rebuilt_minus_proxy"]["delta"] for r in runs]
        rows.append(_comparison(runs[0], "rebuilt - proxy", paired["n"], "", "", paired, seed=seeds,
                                **_spread(deltas)) | {"run": label})
    return rows


def _slips(runs: list[dict[str, Any]], arm: str | None) -> dict[str, list[int]] | None:
    """Slipped edits summed over the seeds: before RL (``arm`` None) or after the arm's RL."""
    return summed_slips([r.get("habits_before") if arm is None else r["arms"][arm].get("habits_after") for r in runs])


def family_sections(runs: list[dict[str, Any]]) -> Sections:
    """By task family, pooled over the seeds: each arm after RL against the warm start, then rebuilt against
    proxy."""
    if not all("per_instance_before" in r for r in runs):
        return []
    before = mean_over_seeds([r["per_instance_before"] for r in runs])
    after = {kind: mean_over_seeds([r["arms"][kind]["per_instance"] for r in runs]) for kind in runs[0]["arms"]}
    sections = [({"A": kind, "B": "warm start"}, family_rows(before, values, _slips(runs, None), _slips(runs, kind),
                                                             sides=("B", "A"))) for kind, values in after.items()]
    if {"proxy", "rebuilt"} <= set(after):
        sections.append(({"A": "rebuilt", "B": "proxy"}, family_rows(after["proxy"], after["rebuilt"],
                                                                     _slips(runs, "proxy"), _slips(runs, "rebuilt"),
                                                                     sides=("B", "A"))))
    return sections


def config_key(run: dict[str, Any]) -> tuple:
    rl = {k: v for k, v in run["rl"].items() if k != "seed"}
    trainer = {k: v for k, v in run.get("trainer", {}).items() if k != "seed"}
    return (run["fingerprint"], run["train_tasks"], tuple(run["arms"]), repr(sorted(rl.items())),
            repr(sorted(trainer.items())), repr(sorted(run.get("samples", {}).items())))


def table_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per configuration: each seed's rows, then the pooled rows."""
    return [r for group in seed_groups(runs, config_key)
            for r in [*(r for run in group for r in arm_rows(run)), *pooled_rows(group)]]


def tokenizer_name(run: dict[str, Any]) -> str:
    """The tokenizer the run's model used: its metrics', else its config's ``model.tokenizer`` (runs before the
    Qwen3 tokenizer existed recorded neither: the recipe BPE)."""
    kind = run.get("tokenizer") or ((run.get("run_config") or {}).get("model") or {}).get("tokenizer") or "bpe"
    return TOKENIZER_NAMES.get(kind, kind)


def fidelity_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    rows, tokenizer = [], tokenizer_name(run)
    for version, fid in run.get("fidelity", {}).items():
        if "error" in fid:
            rows.append({"harness version": version, "tokenizer": tokenizer, "rollouts": 0, "note": fid["error"]})
            continue
        example = fid.get("example") or {}
        excerpt = "" if not example else \
            f"turn {example['turn']}: harness `{example['harness_excerpt']}` / rebuilt `{example['rebuilt_excerpt']}`"
        rows.append({
            "harness version": version, "tokenizer": tokenizer, "rollouts": fid["rollouts"], "turns": fid["turns"],
            "divergent turns": fid["divergent_turns"], "divergence rate": cells.pct(fid["divergence_rate"]),
            "first divergent turn": ", ".join(map(str, fid["first_divergent_turns"])) or "-",
            "rebuilt drift": cells.pct(fid["rebuilt_drift_rate"]),
            "rebuilt exits": ", ".join(f"{k} {v}" for k, v in sorted(fid["rebuilt_exits"].items())),
            "first difference": excerpt.replace("\n", "\\n").replace("|", "\\|"),
        })
    return rows


def comparison_markdown(runs: list[dict[str, Any]], kind_runs: list[dict[str, Any]] | None = None) -> str:
    arms = pd.DataFrame(table_rows(runs)).fillna("")
    fidelity = pd.DataFrame([{"run": cells.run_name(run["run_dir"]), **r} for run in runs for r in fidelity_rows(run)])
    first = runs[-1]
    table = arms.to_markdown(index=False, disable_numparse=True)
    lines = ["## RL through the real harness vs the rebuilt loop", "", table, "",
             f"Both arms of a run start from its seed's warm start ({_warm_starts(runs)}), held-out tasks "
             f"`{first['task_distribution']}`,"
             f" train tasks `{first['train_tasks']}`, evaluation in the real harness, fingerprint "
             f"`{first['fingerprint'][:8]}`. Pass@1 = mean over k={first['before'].get('k', 1)} samples at "
             f"temperature {first.get('eval_temperature', '?')}; deltas are paired over instances in points (bootstrap "
             "interval, sign-flip test); MDE = minimum detectable effect (points, alpha 0.05, 80% power) given "
             "the observed per-instance differences; a pooled row averages each instance over the seeds before "
             "pairing, so proxy vs rebuilt compares the two seed distributions; seed sd = standard deviation of "
             "the seeds' own deltas.", "",
             *_families_section(runs),
             *_diagnostics_section(runs),
             "## Fidelity: recorded real-harness rollouts replayed through the rebuilt loop", "",
             fidelity.to_markdown(index=False) if len(fidelity) else "(no replays)", "",
             "Divergence rate: share of the harness's turns whose prompt ids the rebuilt loop does not reproduce "
             "token for token; rebuilt drift: share of the rebuilt loop's prompts that differ from re-rendering its "
             "own messages; `⟦` marks the first differing token. Tokenizer: the model's (recipe BPE: the project's "
             "own, trained on the recipe corpus, on both sides of every call; on Qwen3's real tokenizer see "
             "`fidelity_real_tokenizer.md`).", "", protocol_note(runs, kind_runs or runs, config_key), "",
             _provenance(runs)]
    return "\n".join(lines) + "\n"


def _provenance(runs: list[dict[str, Any]]) -> str:
    """The command that made the runs (a slice of another experiment's runs says so) and their sources."""
    sliced = " (the proxy and rebuilt arms of each of its runs)" if runs[0].get("slice_of") else ""
    sources = ", ".join(f"`{r['run_dir']}`" for r in runs)
    return f"Command: `{cells.command_line(runs)}`{sliced}, then `repro table`. Sources: {sources}."


def _warm_starts(runs: list[dict[str, Any]]) -> str:
    """``seed 0: `6bbf7940`, seed 1: ...`` (each seed's warm start, once)."""
    seen = {str(r.get("seed", "?")): r["warm_start"]["key"][:8] for r in runs}
    return ", ".join(f"seed {seed}: `{key}`" for seed, key in seen.items())


def arm_runs(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Each arm of a run as a run of its own (for the diagnostics tables): run name ``<run>/<arm>``."""
    return [{"run_dir": f"{run['run_dir']}/{kind}", "name": f"{cells.run_name(run['run_dir'])}/{kind}",
             "seed": run.get("seed", ""), "rl": {}, "table": run.get("table"), "experiment": run["experiment"],
             "diagnostics": arm.get("diagnostics") or [h.get("diagnostics") for h in arm.get("history", [])]}
            for kind, arm in run["arms"].items()]


def all_family_sections(runs: list[dict[str, Any]]) -> Sections:
    """Every configuration's family sections (:func:`family_sections`), in order."""
    return [s for group in seed_groups(runs, config_key) for s in family_sections(group)]


def _families_section(runs: list[dict[str, Any]]) -> list[str]:
    sections = all_family_sections(runs)
    if not sections:
        return []
    return family_markdown(family_frame(sections), "pooled over the seeds; delta = A - B, paired over the family's "
                                                   "tasks")


def _diagnostics_section(runs: list[dict[str, Any]]) -> list[str]:
    summary = diagnostics_summary([a for run in runs for a in arm_runs(run)])
    if summary.empty:
        return []
    return ["### RL diagnostics per arm (every step in the companion `_diagnostics` files)", "",
            summary.to_markdown(index=False, disable_numparse=True), ""]


def write_loop_comparison_tables(runs: list[dict[str, Any]], results: Path) -> list[Path]:
    """``results/<table>.md`` / ``.csv`` and the per-step diagnostics of every arm (``<table>_diagnostics.*``)."""
    written = write_named_tables(runs, results, lambda rows: comparison_markdown(rows, runs), arm_rows)
    arms = [arm for run in runs for arm in arm_runs(run)]
    return written + write_family_csvs(runs, results, all_family_sections) + write_diagnostics(arms, results)

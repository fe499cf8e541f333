"""Tables of ``loop_comparison`` runs: RL through the real harness vs the rebuilt loop, and the fidelity replays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from repro.report.before_after import _pass_cell, _pct, write_named_tables

ARM_PHASES = ("rl_rollouts", "rl_training", "eval_after")


def _delta(paired: dict[str, Any]) -> str:
    return (f"{100 * paired['delta']:+.1f} [{100 * paired['delta_low']:+.1f}, "
            f"{100 * paired['delta_high']:+.1f}]")


def _hours(compute: dict[str, Any]) -> str:
    phases = compute.get("phases", {})
    return ", ".join(f"{p} {phases[p]['wall_s'] / 3600:.3f}" for p in ARM_PHASES if p in phases) or "-"


def arm_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per arm, then the paired difference between the arms."""
    rl, rows = run["rl"], []
    schedule = f"{rl['steps']}x{rl['tasks_per_step']}x{rl['samples_per_task']}, lr {run['trainer']['learning_rate']:g}"
    for kind, arm in run["arms"].items():
        paired, total = arm["paired_vs_before"], arm["compute"].get("total", {})
        rows.append({"run": Path(run["run_dir"]).name, "RL rollouts by": kind, "RL": schedule, "n": paired["n"],
                     "Pass@1 before": _pass_cell(run["before"]), "Pass@1 after": _pass_cell(arm["after"]),
                     "delta vs before [95% CI]": _delta(paired), "sign-flip p": f"{paired['sign_flip_p']:.3g}",
                     "hours (wall)": _hours(arm["compute"]), "CPU core-h": f"{total.get('cpu_core_h', 0):.2f}"})
    between = run.get("rebuilt_minus_proxy")
    if between:
        rows.append({"run": Path(run["run_dir"]).name, "RL rollouts by": "rebuilt - proxy", "RL": schedule,
                     "n": between["n"], "Pass@1 before": "", "Pass@1 after": "",
                     "delta vs before [95% CI]": _delta(between), "sign-flip p": f"{between['sign_flip_p']:.3g}",
                     "hours (wall)": "", "CPU core-h": ""})
    return rows


def fidelity_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for version, fid in run.get("fidelity", {}).items():
        if "error" in fid:
            rows.append({"harness version": version, "rollouts": 0, "note": fid["error"]})
            continue
        example = fid.get("example") or {}
        excerpt = "" if not example else \
            f"turn {example['turn']}: harness `{example['harness_excerpt']}` / rebuilt `{example['rebuilt_excerpt']}`"
        rows.append({
            "harness version": version, "rollouts": fid["rollouts"], "turns": fid["turns"],
            "divergent turns": fid["divergent_turns"], "divergence rate": _pct(fid["divergence_rate"]),
            "first divergent turn": ", ".join(map(str, fid["first_divergent_turns"])) or "-",
            "rebuilt drift": _pct(fid["rebuilt_drift_rate"]),
            "rebuilt exits": ", ".join(f"{k} {v}" for k, v in sorted(fid["rebuilt_exits"].items())),
            "first difference": excerpt.replace("\n", "\\n").replace("|", "\\|"),
        })
    return rows


def comparison_markdown(runs: list[dict[str, Any]]) -> str:
    arms = pd.DataFrame([r for run in runs for r in arm_rows(run)])
    fidelity = pd.DataFrame([{"run": Path(run["run_dir"]).name, **r} for run in runs for r in fidelity_rows(run)])
    first = runs[-1]
    lines = ["## RL through the real harness vs the rebuilt loop", "", arms.to_markdown(index=False), "",
             f"Both arms: warm start `{first['warm_start']['key'][:8]}`, held-out tasks `{first['task_distribution']}`,"
             f" train tasks `{first['train_tasks']}`, evaluation in the real harness, fingerprint "
             f"`{first['fingerprint'][:8]}`. Pass@1 = mean over k={first['before'].get('k', 1)} samples at "
             f"temperature {first.get('eval_temperature', '?')}; deltas are paired over instances (bootstrap "
             "interval, sign-flip test).", "",
             "## Fidelity: recorded real-harness rollouts replayed through the rebuilt loop", "",
             fidelity.to_markdown(index=False) if len(fidelity) else "(no replays)", "",
             "Divergence rate: share of the harness's turns whose prompt ids the rebuilt loop does not reproduce "
             "token for token; rebuilt drift: share of the rebuilt loop's prompts that differ from re-rendering its "
             "own messages; `⟦` marks the first differing token."]
    return "\n".join(lines) + "\n"


def write_loop_comparison_tables(runs: list[dict[str, Any]], results: Path) -> list[Path]:
    return write_named_tables(runs, results, comparison_markdown, arm_rows)

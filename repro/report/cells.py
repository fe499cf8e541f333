"""The cells the result tables share: shares as percentages, Pass@1 with its interval, paired differences in
points, calls per rollout, a run's name. Imports no table module, so every table module can use it."""

from __future__ import annotations

import shlex
import statistics
from pathlib import Path
from typing import Any

from repro.evaluation.metrics import bootstrap_interval
from repro.evaluation.paired import SIGN_FLIP_RESAMPLES, across_seeds  # resamples: what older records drew


def pct(value: float | None) -> str:
    """A share as a percentage with one decimal ('-' for None)."""
    return "-" if value is None else f"{100 * value:.1f}%"


def pass_cell(ev: dict[str, Any]) -> str:
    """``Pass@1 [low, high]`` of one evaluation."""
    return f"{pct(ev['pass_at_1'])} [{pct(ev['ci']['low'])}, {pct(ev['ci']['high'])}]"


def delta_cell(paired: dict[str, Any]) -> str:
    """The paired difference and its interval, in points (``+4.5 [+1.2, +7.9]``)."""
    return (f"{100 * paired['delta']:+.1f} [{100 * paired['delta_low']:+.1f}, {100 * paired['delta_high']:+.1f}]")


def mde_cell(paired: dict[str, Any]) -> str:
    """The minimum detectable effect in points ('-' when unknown)."""
    return "-" if paired.get("mde") is None else f"{100 * paired['mde']:.1f}"




def sign_flip_cell(paired: dict[str, Any]) -> str:
    """The sign-flip p with three significant digits; at its Monte Carlo floor (no resample as extreme as the
    observed difference: ``1 / (resamples + 1)``) it is a bound, ``< 5e-05``, not a value."""
    p = paired.get("sign_flip_p")
    if p is None:
        return "-"
    floor = 1 / (paired.get("sign_flip_resamples", SIGN_FLIP_RESAMPLES) + 1)
    return f"< {floor:.1g}" if p <= floor * (1 + 1e-9) else f"{p:.3g}"


def identical(paired: dict[str, Any]) -> bool:
    """Whether the two sides had the same outcome on every instance (every paired difference 0)."""
    return paired.get("delta") == 0 and paired.get("mde") == 0 and paired.get("delta_low") == paired.get(
        "delta_high") == 0


IDENTICAL = "identical on every instance"


def paired_cells(paired: dict[str, Any]) -> dict[str, str]:
    """The difference [95% CI], MDE and sign-flip p of a paired comparison; identical outcomes say so instead of
    printing a zero interval, an MDE of 0 and p = 1 as if they were statistics."""
    if identical(paired):
        return {"delta [95% CI]": IDENTICAL, "MDE": "-", "sign-flip p": "-"}
    return {"delta [95% CI]": delta_cell(paired), "MDE": mde_cell(paired),
            "sign-flip p": sign_flip_cell(paired)}


def mean_cell(values: dict[str, float]) -> str:
    """``44.5% [41.2%, 47.6%]``: the mean of per-instance values with its bootstrap interval over instances."""
    low, high = bootstrap_interval(list(values.values()))
    return f"{pct(statistics.fmean(values.values()))} [{pct(low)}, {pct(high)}]"


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


def run_name(run_dir: str) -> str:
    """A run's name in a table: its directory, with the sweep's when it is a multirun job (``<time>/0``); a slice
    of a run (``<run>/loop_comparison``) is named by that run."""
    path = Path(run_dir)
    if path.name == "loop_comparison" and path.parent.name:
        return run_name(str(path.parent))
    return f"{path.parent.name}/{path.name}" if path.name.isdigit() else path.name


_NOT_IN_COMMANDS = ("seed=", "experiment=", "run.dir=", "run.output_root=")  # joined below, or a machine's paths


def command_line(runs: list[dict[str, Any]]) -> str:
    """``repro run -m experiment=X <overrides> seed=0,1,2``: the command that made ``runs`` (the first run's
    overrides, without a machine's paths, each quoted for the shell where it needs it: a list of dicts would
    otherwise be brace-expanded; the experiment it was started with, else its table's)."""
    seeds = ",".join(dict.fromkeys(str(r.get("seed", "?")) for r in runs))
    kept = [shlex.quote(o) for o in runs[0].get("overrides") or [] if not o.startswith(_NOT_IN_COMMANDS)]
    return " ".join(["repro run -m", f"experiment={hydra_experiment(runs[0])}", *kept, f"seed={seeds}"])


def hydra_experiment(run: dict[str, Any]) -> str:
    """The experiment config a run was started with (its ``experiment=`` override), else its table's name."""
    chosen = [o.split("=", 1)[1] for o in run.get("overrides") or [] if o.startswith("experiment=")]
    return chosen[0] if chosen else run.get("experiment", "?")


def seeds_cell(deltas: list[float]) -> str:
    """The seeds' own deltas as the sample: ``+6.3 [-4.2, +16.8], p 0.124`` (t interval and t-test over seeds, in
    points); ``-`` for one seed."""
    found = across_seeds(deltas)
    if found is None:
        return "-"
    if found["low"] == found["high"]:
        return f"every seed {100 * found['mean']:+.1f}"
    return (f"{100 * found['mean']:+.1f} [{100 * found['low']:+.1f}, {100 * found['high']:+.1f}], "
            f"p {found['p']:.3g}")

"""``results/vllm_cpu.md``: the engine comparison (``experiment=bench_engines``, kind ``engine_comparison``) of the
newest run: per engine and phase the wall time, tokens/s and server memory; the weight syncs and their checks; the
logprob parity of each served dtype against the float32 trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from repro.report.table_files import write_newest_table

PHASES = ("eval_before", "rl", "eval_after")


def engine_frame(metrics: dict[str, Any]) -> pd.DataFrame:
    """One row per engine: start-up, each phase's wall time and tokens/s, peak RSS, syncs, Pass@1."""
    rows = []
    for e in metrics["engines"]:
        row: dict[str, Any] = {"engine": e["engine"], "dtype": e["dtype"], "startup_s": e["startup_s"]}
        for phase in PHASES:
            p = e["phases"].get(phase, {})
            row[f"{phase}_s"] = p.get("wall_s")
            row[f"{phase}_tok_per_s"] = p.get("tokens_per_s")
        row["total_s"] = e["wall_s"]
        row["rss_peak_mb"] = round(max(e["rss_peak_mb"].values(), default=0.0))
        syncs = e["rl"]["sync_s"]
        row["sync_s_mean"] = round(sum(syncs) / len(syncs), 3) if syncs else None
        checks = e["rl"]["reload_checks"]
        row["reload_checks_passed"] = f"{sum(c['passed'] for c in checks)}/{len(checks)}"
        row["pass_at_1_before"] = e["pass_at_1"]["before"]
        row["pass_at_1_after"] = e["pass_at_1"]["after"]
        rows.append(row)
    return pd.DataFrame(rows)


def parity_frame(metrics: dict[str, Any]) -> pd.DataFrame:
    columns = ["engine", "served_dtype", "rows", "tokens", "max_abs_diff", "mean_abs_diff", "within_tolerance"]
    return pd.DataFrame(metrics["parity"])[columns]


def engines_markdown(runs: list[dict[str, Any]]) -> str:
    """Markdown for the newest engine comparison, with its provenance."""
    m = runs[-1]
    ev, rl = m["eval"], m["rl"]
    by_engine = {e["engine"]: e for e in m["engines"]}
    lines = [
        "# The real vLLM on CPU beside repro's CPU engine",
        "",
        f"The miniature's phases after its warm start (`{m['warm_start']['key']}`), on each engine in one run: the "
        f"frozen evaluation of {ev['n_tasks']} held-out tasks (k={ev['k']}, T={ev['temperature']}), `rl`: the probe "
        "step (its task pool from the cache when the miniature has run before: then the same on both) and "
        f"{rl['steps']} RL steps of {rl['tasks_per_step']} tasks x {rl['samples_per_task']} samples (each update "
        "reloaded into the running server and checked by the weight probe), the frozen evaluation again. Same "
        "harness (mini-SWE-agent through the recording proxy), tasks, seeds and trainer; each engine samples with its "
        "own RNG, so Pass@1 differs by sampling noise, not by design. tok/s: completion tokens of the phase's calls "
        "per wall second; RSS: peak of the server process and its children.",
        "",
        engine_frame(m).to_markdown(index=False, floatfmt=".3g"),
        "",
        "## Logprob parity (served vs the float32 trainer, per token)",
        "",
        "Recorded logprobs of each engine's first evaluation (the first 64 calls), and of vLLM serving bfloat16 "
        f"on the first {m['bench']['bf16_tasks']} held-out tasks, against a teacher-forced float32 transformers pass "
        "of the same checkpoint: what the trainer's step-0 guard and its importance ratios compare.",
        "",
        parity_frame(m).to_markdown(index=False, floatfmt=".3g"),
        "",
    ]
    if "vllm" in by_engine and "cpu" in by_engine:
        v, c = by_engine["vllm"], by_engine["cpu"]
        lines += [f"End to end (start-up + the three phases): vLLM {v['wall_s']:.0f} s, the CPU engine "
                  f"{c['wall_s']:.0f} s (ratio {v['wall_s'] / c['wall_s']:.2f}).", ""]
    lines.append(f"Source: `{m.get('run_dir', '?')}` · `repro run experiment=bench_engines` then `repro table`.")
    return "\n".join(lines) + "\n"


def write_engine_tables(runs: list[dict[str, Any]], results: Path) -> list[Path]:
    """``results/vllm_cpu.md`` (the newest run) and ``.csv``."""
    return write_newest_table(runs, results, "vllm_cpu", engines_markdown, engine_frame)

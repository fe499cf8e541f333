"""``scripts/gpu_check.sh --trainer verl``: verl's actor on the rows the check recorded through the proxy.

Two steps after the project's own train step:

* ``verl_env``: verl's cached environment (:mod:`repro.verl.env`), built when missing; its seconds are recorded (the
  build is the check's largest fixed cost on a fresh machine).
* ``verl_actor``: the recorded calls as rows (prompt, sampled completion, the server's logprobs) through
  ``python -m repro.verl.check``: verl's ``compute_log_prob`` must equal the logprobs the server sampled with, within
  the served dtype's tolerance (the check's logprob tolerances), then one ``update_actor`` (FSDP2, over up to 2 GPUs
  with torchrun; on a machine without one, the CPU platform and gloo) must finish with a finite loss.

On a GPU verl runs its own ``nvidia`` platform, NCCL and bf16; on CPU this is the suite's check on real recorded rows.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from pathlib import Path
from typing import Any

from repro.bench.gpu_check_runner import Context, SkipStep

PARAM_DTYPES = {"float32": "fp32", "bfloat16": "bf16"}


def verl_env(ctx: Context) -> tuple[Path, dict[str, Any]]:
    from repro.verl.env import cached_verl_python, ensure_verl_env

    started, cached = time.monotonic(), cached_verl_python() is not None
    python = ensure_verl_env()
    return python, {"python": str(python), "cached": cached, "build_s": round(time.monotonic() - started, 1)}


def recorded_rows(rows: list[Any]) -> list[Any]:
    """The check's recorded calls as rows verl's batch takes: the prompt (mask 0), the completion (mask 1) with the
    server's logprobs; advantage +1 for a rewarded rollout, -1 otherwise (one update step, not a training run)."""
    from repro.verl.batch import PlainRow

    return [PlainRow(rollout_id=f"{r.rollout_id}#{r.seq}", group_id=r.rollout_id, row_index=r.seq,
                     input_ids=list(r.prompt_ids) + list(r.completion_ids),
                     loss_mask=[0] * len(r.prompt_ids) + [1] * len(r.completion_ids),
                     old_logprobs=[0.0] * len(r.prompt_ids) + [float(x) for x in r.logprobs], weight=1.0,
                     advantage=1.0 if r.reward else -1.0, reward=r.reward)
            for r in rows if len(r.logprobs) == len(r.completion_ids)]


def _run(python: Path, args: list[str], nproc: int, log: Path) -> float:
    from repro.net import free_port
    from repro.verl.env import verl_command, verl_env_vars

    started = time.monotonic()
    command = verl_command(python, "repro.verl.check", *args, nproc=nproc, master_port=free_port())
    with log.open("a") as out:
        done = subprocess.run(command, env=verl_env_vars(), stdout=out, stderr=subprocess.STDOUT, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:1])} failed (exit {done.returncode}): see {log.name}")
    return round(time.monotonic() - started, 1)


def verl_actor(ctx: Context, python: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    from repro.bench.logprob_check import TOLERANCES
    from repro.verl.batch import rows_to_json

    rows = recorded_rows(ctx.rows[: ctx.cfg.max_rows])
    if len(rows) < 2:
        raise SkipStep("fewer than 2 recorded rows with logprobs (the rollout step did not produce them)")
    rows = rows[: len(rows) // 2 * 2]  # an even count: the update shards the rows over 2 ranks
    work, log = ctx.work / "verl", ctx.cfg.out / "verl_check.log"
    work.mkdir(parents=True, exist_ok=True)
    rows_file = rows_to_json(rows, work / "rows.json")
    common = ["--model", str(ctx.served_dir or ctx.model_dir), "--rows", str(rows_file),
              "--param-dtype", PARAM_DTYPES.get(ctx.dtype, "fp32"), "--lr", str(ctx.cfg.lr)]
    lp_s = _run(python, ["logprobs", *common, "--out", str(work / "logprobs.json")], 1, log)
    verl = json.loads((work / "logprobs.json").read_text())
    diffs = [abs(a - b) for row, mine in zip(rows, verl, strict=True)
             for a, b, m in zip(mine, row.old_logprobs[row.loss_mask.index(1):], row.loss_mask[row.loss_mask.index(1):],
                                strict=True) if m]
    gpus = int(ctx.env.get("device_count") or 0)
    nproc = 2 if gpus >= 2 or ctx.device == "cpu" else 1
    update_s = _run(python, ["update", *common, "--out", str(work / "update")], nproc, log)
    metrics = json.loads((work / "update" / "metrics.json").read_text())
    loss = metrics.get("actor/pg_loss", [math.nan])[0]
    tol = TOLERANCES.get(ctx.dtype, TOLERANCES["float32"])
    details = {"rows": len(rows), "sampled_tokens": len(diffs), "max_abs_vs_served": max(diffs),
               "mean_abs_vs_served": sum(diffs) / len(diffs), "tolerance": tol.max_abs, "processes": nproc,
               "logprobs_s": lp_s, "update_s": update_s, "pg_loss": loss, "grad_norm": metrics.get("grad_norm"),
               "param_dtype": PARAM_DTYPES.get(ctx.dtype, "fp32")}
    details["passed"] = details["max_abs_vs_served"] <= tol.max_abs and details["mean_abs_vs_served"] <= \
        tol.mean_abs and math.isfinite(loss)
    return details, details


def verl_steps(ctx: Context, runner: Any) -> None:
    """The two steps, when ``--trainer verl``."""
    python = runner.step("verl_env", verl_env, ctx, need_s=90.0)
    if python is None:
        runner.skip("verl_actor", "verl's environment is not there (see the verl_env step)")
        return
    runner.step("verl_actor", verl_actor, ctx, python, need_s=60.0)

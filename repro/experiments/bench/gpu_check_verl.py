"""``scripts/gpu_check.sh --trainer verl``: verl's actor on the rows the check recorded through the proxy.

Two steps after the project's own train step:

* ``verl_env``: verl's cached environment (:mod:`repro.verl.env`), built when missing; its seconds are recorded (the
  build is the check's largest fixed cost on a fresh machine).
* ``verl_actor``: the recorded calls as rows (prompt, sampled completion, the server's logprobs) through
  ``python -m repro.verl.check``: verl's ``compute_log_prob`` must equal the logprobs the server sampled with, within
  the served dtype's tolerance (the check's logprob tolerances), then one ``update_actor`` (FSDP2, over up to 2 GPUs
  with torchrun; on a machine without one, the CPU platform and gloo) must finish with a finite loss.

* ``verl_loop`` (GPUs only, vLLM in verl's environment): the job's own path for ``trainer=verl`` on GPUs, 2 steps
  on the small model: :class:`repro.verl.policy.VerlPolicy` places verl's actor and its colocated vLLM replica with
  Ray, the recording proxy goes in front of the replica (:func:`repro.serving.stack.verl_stack`), chat calls are
  recorded through it, the replica sleeps and the actor updates on the recorded rows, verl pushes the weights into
  the replica (CUDA IPC), the weight probe checks the served logprobs against the actor's; seconds and GPU memory
  (``nvidia-smi``) per phase.

On a GPU verl runs its own ``nvidia`` platform, NCCL and bf16; on CPU this is the suite's check on real recorded rows.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import time
from pathlib import Path
from typing import Any

from repro.experiments.bench.gpu_check_runner import PROMPTS, Context, SkipStep

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
    from repro.common.net import free_port
    from repro.verl.env import verl_command, verl_env_vars

    started = time.monotonic()
    command = verl_command(python, "repro.verl.check", *args, nproc=nproc, master_port=free_port())
    with log.open("a") as out:
        done = subprocess.run(command, env=verl_env_vars(), stdout=out, stderr=subprocess.STDOUT, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:1])} failed (exit {done.returncode}): see {log.name}")
    return round(time.monotonic() - started, 1)


def verl_actor(ctx: Context, python: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    from repro.serving.weight_probe import TOLERANCES
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


def gpu_memory_mib() -> list[int]:
    """Memory used on each GPU (``nvidia-smi``), MiB; [] without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [int(x) for x in out.split() if x.strip().isdigit()]


def _loop_calls(stack: Any, step: int, n: int, max_tokens: int) -> list[str]:
    import httpx

    ids = []
    for i, prompt in enumerate(PROMPTS[:n]):
        rollout_id = f"verl-loop-{step}-{i}"
        base_url = stack.client.register(rollout_id=rollout_id, mode="train", metadata={
            "sampling": {"max_tokens": max_tokens, "seed": i}})
        httpx.post(f"{base_url}/chat/completions", timeout=300, json={
            "model": stack.served_model_name, "messages": [{"role": "user", "content": prompt}]}).raise_for_status()
        ids.append(rollout_id)
    return ids


def verl_loop(ctx: Context, python: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two steps of the job's ``trainer=verl`` GPU path on the small model (see the module docstring)."""
    import shutil

    from repro.experiments.bench.logprob_check import rows_from_store
    from repro.proxy import ProxyConfig
    from repro.serving.stack import verl_stack
    from repro.verl.config import VerlUpdateConfig
    from repro.verl.policy import VerlPolicy

    if ctx.device == "cpu":
        raise SkipStep("no GPU: verl's vLLM replicas need one (the CPU path is the miniature's, trainer=verl_cpu)")
    done = subprocess.run([str(python), "-c", "import vllm"], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SkipStep(f"vLLM does not import in verl's environment {python.parent.parent} (verl[vllm] builds it "
                       f"where pip can reach PyPI): {done.stderr.strip().splitlines()[-1:]}")
    policy_dir, run_dir = ctx.work / "verl_policy", ctx.work / "verl_run"
    shutil.rmtree(policy_dir, ignore_errors=True)
    shutil.copytree(ctx.model_dir, policy_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = VerlUpdateConfig(device="cuda", bf16=True, n_gpus_per_node=1, placement="ray", param_offload=False,
                           optimizer_offload=False, ulysses_sequence_parallel_size=1, max_row_tokens=4096,
                           rollout_gpu_memory_utilization=0.4, learning_rate=ctx.cfg.lr, on_policy_log_ratio_max=0.0)
    phases: list[dict[str, Any]] = []

    def mark(name: str, started: float) -> None:
        phases.append({"phase": name, "s": round(time.monotonic() - started, 2), "gpu_mib": gpu_memory_mib()})

    started = time.monotonic()
    policy = VerlPolicy(policy_dir, cfg)
    try:
        mark("start_actor_and_replica", started)
        urls, name = policy.rollout_servers()
        with verl_stack(policy_dir, urls, name, policy.sync_rollout, ProxyConfig(port=0), run_dir) as stack:
            checks = []
            for step in range(2):
                started = time.monotonic()
                ids = _loop_calls(stack, step, 4, ctx.cfg.max_tokens)
                mark(f"step{step}_rollouts", started)
                rows = [r for r in recorded_rows(rows_from_store(run_dir / "traces.sqlite")) if r.group_id in ids]
                started = time.monotonic()
                stats = policy.update(rows)
                mark(f"step{step}_update", started)
                started = time.monotonic()
                stack.sync_weights(policy_dir, version=step + 1, scorer=policy.score)
                mark(f"step{step}_sync_and_probe", started)
                checks.append(dataclasses.asdict(stack.reload_checks[-1]) | {"rows": len(rows),
                                                                             "loss": stats["updates"][0]["loss"]})
    finally:
        policy.close()
    details = {"replicas": urls, "phases": phases, "reload_checks": checks,
               "passed": all(c["passed"] for c in checks) and len(checks) == 2}
    return details, details


def verl_steps(ctx: Context, runner: Any) -> None:
    """The steps, when ``--trainer verl``."""
    python = runner.step("verl_env", verl_env, ctx, need_s=90.0)
    if python is None:
        for name in ("verl_actor", "verl_loop"):
            runner.skip(name, "verl's environment is not there (see the verl_env step)")
        return
    runner.step("verl_actor", verl_actor, ctx, python, need_s=60.0)
    runner.step("verl_loop", verl_loop, ctx, python, need_s=150.0)

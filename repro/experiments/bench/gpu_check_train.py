"""The GPU check's training steps: one policy-gradient step on the recorded rows, then the new weights pushed into
the running vLLM (or, without a server, reloaded from disk) and checked against the trained checkpoint."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from repro.experiments.bench.gpu_check_runner import PROMPTS, SERVED_NAME, Context, SkipStep


def advantages(rewards: list[float | None]) -> list[float]:
    """Rewards minus their mean; when they are all equal (no signal, e.g. every rollout failed), alternating
    +1 / -1, so that the step still changes the weights (the check is about plumbing, not learning)."""
    values = [0.0 if r is None else float(r) for r in rewards]
    mean = sum(values) / len(values) if values else 0.0
    if all(abs(v - mean) < 1e-12 for v in values):
        return [1.0 if i % 2 == 0 else -1.0 for i in range(len(values))]
    return [v - mean for v in values]


def training_rows(rows: list[Any], advs: list[float], max_len: int) -> list[Any]:
    """Recorded calls as the trainer's rows (``repro.train.samples.Row``): prompt + completion (the completion's head
    and the prompt's tail within ``max_len``), loss on the completion, the server's logprobs as the sampling logprobs;
    rows lacking a logprob for a token are left out."""
    from repro.train.samples import Row

    out = []
    for index, (row, adv) in enumerate(zip(rows, advs, strict=True)):
        completion = row.completion_ids[: max_len - 1]
        prompt = row.prompt_ids[-(max_len - len(completion)) :]
        logprobs = row.logprobs[: len(completion)]
        if len(logprobs) < len(completion):
            continue
        out.append(Row(row.rollout_id, "", row.rollout_id, index, [row.seq], prompt + completion,
                       [0] * len(prompt) + [1] * len(completion), [0.0] * len(prompt) + list(logprobs), 1.0, adv,
                       row.reward))
    return out


def train_step(ctx: Context) -> tuple[Path, dict[str, Any]]:
    """One policy-gradient step of the project's one trainer (``repro.train.rl.PolicyTrainer``, fp32 on the
    device, the recorded logprobs as sampling logprobs) on the rows, saved as ``work/step-1``."""
    from repro.train.config import UpdateConfig
    from repro.train.rl import PolicyTrainer

    if not ctx.rows:
        raise SkipStep("no rows to train on")
    recorded = ctx.rows[: ctx.cfg.max_rows]
    rows = training_rows(recorded, advantages([r.reward for r in recorded]), ctx.cfg.max_len)
    if not rows:
        raise ValueError("no recorded row has a logprob for every completion token")
    # one update, one row per micro-batch; no on-policy bound: the served dtype's drift is logprob_check's to measure
    cfg = UpdateConfig(device=ctx.device, learning_rate=ctx.cfg.lr, updates_per_batch=1, micro_batch_rows=1,
                   on_policy_log_ratio_max=0.0, weight_decay=0.0)
    trainer = PolicyTrainer(ctx.model_dir, cfg)
    stats = trainer.update(rows)
    ctx.new_dir = trainer.save(ctx.work / "step-1")
    update = stats["updates"][0] if stats["updates"] else {}
    return ctx.new_dir, {"trainer": "repro.train.rl.PolicyTrainer", "device": str(trainer.device),
                         "n_rows": stats["rows_trained"], "n_tokens": stats["sampled_tokens"], "lr": ctx.cfg.lr,
                         "update_seconds": stats["seconds"], **update, "checkpoint": str(ctx.new_dir)}


def _verify_tracks(ctx: Context, rows: list[Any], new: Any) -> dict[str, Any]:
    """The rows must match the new checkpoint and differ from the old one by more than the tolerance."""
    from repro.experiments.bench.logprob_check import compare_rows, load_causal_lm
    from repro.serving.weight_probe import TOLERANCES

    tol = TOLERANCES[ctx.dtype]
    vs_new = compare_rows(new, rows, ctx.device, tol)
    vs_old = compare_rows(load_causal_lm(ctx.model_dir, ctx.dtype, ctx.device), rows, ctx.device, tol)
    changed = vs_old["max_abs_diff"] > tol.max_abs or vs_old["argmax_mismatches"] > 0
    return {"vs_new": vs_new, "vs_old": vs_old, "changed": changed, "passed": vs_new["passed"] and changed}


def weight_sync(ctx: Context) -> tuple[None, dict[str, Any]]:
    """Push ``step-1`` into the running vLLM; a greedy request must then follow the new checkpoint."""
    from repro.experiments.bench.logprob_check import compare_rows, load_causal_lm
    from repro.serving.vllm_weights import reload_weights
    from repro.serving.weight_probe import TOLERANCES

    if ctx.new_dir is None:
        raise SkipStep("no trained checkpoint")
    prompt = ctx.rows[0].prompt_ids if ctx.rows else [1, 2, 3]
    before = compare_rows(load_causal_lm(ctx.model_dir, ctx.dtype, ctx.device),
                          [_greedy_row(ctx, prompt)], ctx.device, TOLERANCES[ctx.dtype])
    from repro.serving.vllm_weights import write_untied

    weights = write_untied(ctx.new_dir, ctx.work / "step-1-untied") if ctx.untie else ctx.new_dir
    result = reload_weights(ctx.stack.server_url, weights, ctx.served_dir, python=ctx.env.get("vllm_python") or "")
    after = _verify_tracks(ctx, [_greedy_row(ctx, prompt)],
                           load_causal_lm(ctx.new_dir, ctx.dtype, ctx.device))
    return None, {"sync": asdict(result), "before_sync_vs_old": before, **after,
                  "passed": before["passed"] and after["passed"]}


def checkpoint_reload(ctx: Context) -> tuple[None, dict[str, Any]]:
    """Without a server: rows generated by the saved checkpoint must match it reloaded, not the old weights."""
    from transformers import AutoTokenizer

    from repro.experiments.bench.logprob_check import greedy_rows, load_causal_lm

    if ctx.new_dir is None:
        raise SkipStep("no trained checkpoint")
    new = load_causal_lm(ctx.new_dir, ctx.dtype, ctx.device)
    tokenizer = AutoTokenizer.from_pretrained(str(ctx.new_dir))
    rows = greedy_rows(new, tokenizer, list(PROMPTS[:2]), 16, ctx.device)
    return None, _verify_tracks(ctx, rows, new)



def _greedy_row(ctx: Context, prompt_ids: list[int], max_tokens: int = 16) -> Any:
    """A greedy completion of ``prompt_ids`` straight from the running server (the weight probe's request), as a
    row for the logprob comparison."""
    from repro.experiments.bench.logprob_check import Row
    from repro.serving.weight_probe import sample

    sampled = sample(ctx.stack.server_url, SERVED_NAME, prompt_ids, max_tokens)
    return Row("weight-sync", 0, list(prompt_ids), sampled.ids, sampled.logprobs, 0.0)

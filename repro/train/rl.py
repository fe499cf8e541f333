"""The policy-gradient trainer: weighted, masked rows in; an updated, servable checkpoint out.

The objective (GRPO/DAPO-style clipped policy gradient, no KL term) and the rows' tensors are in
:mod:`repro.train.objective`. How many optimizer steps, on which rows, against which old logprobs:
:meth:`PolicyTrainer.update` (the plan of mini-batches: :mod:`repro.train.batching`). Loading the checkpoint into a
running server is :mod:`repro.serving.sync`'s job.
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from repro.train.batching import UpdatePlan, micro_batches, plan_updates
from repro.train.config import UpdateConfig
from repro.train.device import base_model, distributed, make_accelerator, merged_state_dict, prepare_model
from repro.train.objective import (
    Mismatch,
    TrainingRow,
    check_on_policy,
    check_rows,
    clipped_policy_loss,
    own_logprobs,
    pad_rows,
    rebased,
    token_logprobs,
    token_logprobs_and_entropy,
)

# Files besides the weights that make a checkpoint directory servable (tokenizer, chat template, provenance);
# vocab.json / merges.txt / added_tokens.json are a real model's (Qwen's) slow-tokenizer files.
CHECKPOINT_EXTRAS = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                     "repro_model.json", "vocab.json", "merges.txt", "added_tokens.json")


def copy_extras(src: Path, dst: Path) -> None:
    """Copy tokenizer and provenance files from one checkpoint directory to another."""
    for name in CHECKPOINT_EXTRAS:
        if (Path(src) / name).exists():
            shutil.copy2(Path(src) / name, Path(dst) / name)


class PolicyTrainer:
    """Holds the policy and its optimizer across RL steps, on the device its settings name (through accelerate:
    :mod:`repro.train.device`); with the defaults (fp32 on the CPU, full fine-tuning) a plain torch loop."""

    def __init__(self, model_dir: Path, cfg: UpdateConfig) -> None:
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        torch.manual_seed(cfg.seed)
        self.cfg, self.model_dir = cfg, Path(model_dir)
        self.accelerator = make_accelerator(cfg)
        model = prepare_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), cfg)
        model.train()
        self.pad_id = base_model(model).config.pad_token_id or 0
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.learning_rate,
                                      betas=cfg.adam_betas, weight_decay=cfg.weight_decay)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.device = self.accelerator.device
        self.rng = random.Random(cfg.seed)
        self.steps = 0

    def _chunks(self, rows: Sequence[TrainingRow]) -> list[list[TrainingRow]]:
        """``rows`` as forward passes, grouped by length (:func:`repro.train.batching.micro_batches`)."""
        cuts = micro_batches(rows, self.cfg.micro_batch_rows, self.cfg.micro_batch_tokens)
        return [[rows[i] for i in cut] for cut in cuts]

    def _batch(self, rows: Sequence[TrainingRow]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device) for k, v in pad_rows(rows, self.pad_id).items()}

    def plan(self, rows: Sequence[TrainingRow]) -> UpdatePlan | None:
        """The step's mini-batches (indices into ``rows``; only rows of weight > 0 are planned), or None under
        ``ppo_mini_batch_rows=0`` (every row in each of ``updates_per_batch`` passes)."""
        if not self.cfg.ppo_mini_batch_rows:
            return None
        live = [i for i, r in enumerate(rows) if r.weight > 0]
        plan = plan_updates([rows[i] for i in live], self.cfg.ppo_mini_batch_rows, self.cfg.max_ppo_updates,
                            self.rng)
        return UpdatePlan([[live[i] for i in batch] for batch in plan.mini_batches], len(rows),
                          plan.dropped_zero_advantage, plan.dropped_other)

    def update(self, rows: Sequence[TrainingRow], plan: UpdatePlan | None = None) -> dict[str, Any]:
        """Optimizer steps on ``rows``: ``updates_per_batch`` passes over every row, or (``ppo_mini_batch_rows`` > 0)
        one per mini-batch of ``plan`` (:meth:`plan` when not given); returns what happened (for the run's log)."""
        if self.cfg.ppo_mini_batch_rows:
            return self._update_mini_batches(rows, self.plan(rows) if plan is None else plan)
        if plan is not None:
            raise ValueError("a plan of mini-batches needs trainer.ppo_mini_batch_rows > 0")
        started = time.perf_counter()
        live = [r for r in rows if r.weight > 0]
        check_rows(live)
        normalizer = sum(r.weight for r in live)
        used = [r for r in live if r.advantage != 0 or not self.cfg.skip_zero_advantage]
        stats: dict[str, Any] = {"rows": len(rows), "rows_trained": len(used), "normalizer": normalizer,
                                 "sampled_tokens": sum(sum(r.loss_mask) for r in used), "updates": []}
        if not used or normalizer <= 0:  # nothing to learn from; still check and measure the sampling policy
            return self._no_update(live, stats, started)
        recompute = self.cfg.old_logprobs == "recompute"
        mismatch, own = Mismatch(), {}
        for index in range(self.cfg.updates_per_batch):
            first = index == 0
            batch_rows = used if first or not recompute else [rebased(r, own[id(r)]) for r in used]
            stats["updates"].append(self._one_update(batch_rows, normalizer, first=first, self_old=first and recompute,
                                                     mismatch=mismatch if first else None,
                                                     own=own if first and recompute else None))
            if first:
                check_on_policy(mismatch.max, self.cfg.on_policy_log_ratio_max)
        self.steps += 1
        return self._finish(stats, mismatch, len(stats["updates"]), started)

    def _update_mini_batches(self, rows: Sequence[TrainingRow], plan: UpdatePlan) -> dict[str, Any]:
        """One optimizer step per planned mini-batch; the normalizer is the sum of every planned row's weight (Agent
        Lightning's per-rollout mean divides by the step's trained rows, zero-advantage ones included)."""
        started = time.perf_counter()
        live = [r for r in rows if r.weight > 0]
        check_rows(live)
        batches = [[rows[i] for i in batch] for batch in plan.mini_batches]
        planned = [r for batch in batches for r in batch]
        normalizer = sum(r.weight for r in planned)
        trained = [[r for r in batch if r.advantage != 0 or not self.cfg.skip_zero_advantage] for batch in batches]
        stats: dict[str, Any] = {
            "rows": len(rows), "rows_planned": len(planned), "rows_trained": sum(len(b) for b in trained),
            "dropped_zero_advantage": plan.dropped_zero_advantage, "dropped_other": plan.dropped_other,
            "normalizer": normalizer, "sampled_tokens": sum(sum(r.loss_mask) for b in trained for r in b),
            "updates": []}
        if plan.skipped or normalizer <= 0:
            return self._no_update(live, stats, started)
        recompute = self.cfg.old_logprobs == "recompute"
        mismatch = Mismatch()
        if not trained[0]:  # the first mini-batch is all zero-advantage: measure the sampling policy on it
            self._measure(batches[0], mismatch)
        if recompute:  # every later mini-batch's old logprobs, from the weights before the first optimizer step
            trained[1:] = [self._rebase(batch, mismatch) for batch in trained[1:]]
        for index, batch in enumerate(trained):
            first = index == 0
            stats["updates"].append(self._one_update(batch, normalizer, first=first, self_old=first and recompute,
                                                     mismatch=mismatch if first else None, fill_grads=True))
            if first:
                check_on_policy(mismatch.max, self.cfg.on_policy_log_ratio_max)
        self.steps += 1
        return self._finish(stats, mismatch, len(trained), started)

    def _no_update(self, live: list[TrainingRow], stats: dict[str, Any], started: float) -> dict[str, Any]:
        """No optimizer step: the sampling policy still measured and checked on the live rows."""
        mismatch = Mismatch()
        if live:
            stats["measured"] = self._measure(live, mismatch)
            check_on_policy(mismatch.max, self.cfg.on_policy_log_ratio_max)
        return self._finish(stats, mismatch, 0, started)

    @staticmethod
    def _finish(stats: dict[str, Any], mismatch: Mismatch, steps: int, started: float) -> dict[str, Any]:
        stats.update(optimizer_steps=steps, update_skipped=steps == 0,
                     old_logprob_mismatch={"max": mismatch.max, "mean": mismatch.mean, "tokens": mismatch.tokens},
                     seconds=time.perf_counter() - started)
        return stats

    def _one_update(self, rows: list[TrainingRow], normalizer: float, first: bool, self_old: bool = False,
                    mismatch: Mismatch | None = None, own: dict[int, list[float]] | None = None,
                    fill_grads: bool = False) -> dict[str, float]:
        """One optimizer step over ``rows`` in micro-batches; the ``first`` of a batch also measures the sampling
        policy's entropy on the sampled tokens (its weights are still the sampler's). ``self_old``: the forward's own
        logprobs, detached, are the old ones (ratio exactly 1), kept in ``own`` (by row id) when given; ``mismatch``
        collects the recorded-vs-trainer difference; ``fill_grads``: step even without rows (zero gradients, as
        verl steps on a mini-batch of zero advantages)."""
        order = list(rows)
        self.rng.shuffle(order)
        self.optimizer.zero_grad(set_to_none=True)
        total, merged = 0.0, {"clip_fraction": 0.0, "ratio_mean": 0.0, "log_ratio_abs_max": 0.0}
        entropy_sum, tokens = 0.0, 0.0
        chunks = self._chunks(order)
        for chunk in chunks:
            batch = self._batch(chunk)
            logps, entropy = token_logprobs_and_entropy(self.model, batch["input_ids"], batch["attention_mask"],
                                                        with_entropy=first)
            if mismatch is not None:
                mismatch.add(logps, batch["old_logps"], batch["loss_mask"])
            old = logps.detach() if self_old else batch["old_logps"]
            if own is not None:
                own.update(own_logprobs(chunk, old))
            loss, st = clipped_policy_loss(logps, old, batch["advantages"], batch["loss_mask"], batch["weights"],
                                           normalizer, self.cfg.clip_low, self.cfg.clip_high, self.cfg.clip_ratio_c)
            self.accelerator.backward(loss)
            total += float(loss.detach())
            merged["clip_fraction"] += st["clip_fraction"] / len(chunks)
            merged["ratio_mean"] += st["ratio_mean"] / len(chunks)
            merged["log_ratio_abs_max"] = max(merged["log_ratio_abs_max"], st["log_ratio_abs_max"])
            if "dual_clip_fraction" in st:
                merged["dual_clip_fraction"] = (merged.get("dual_clip_fraction", 0.0)
                                                + st["dual_clip_fraction"] / len(chunks))
            if entropy is not None:
                entropy_sum += float((entropy * batch["loss_mask"]).sum())
                tokens += float(batch["loss_mask"].sum())
        if fill_grads:
            for param in self.model.parameters():
                if param.requires_grad and param.grad is None:
                    param.grad = torch.zeros_like(param)
        grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        out = {"loss": total, "grad_norm": float(grad_norm), **merged}
        if first:
            out["entropy"] = entropy_sum / tokens if tokens else 0.0
        return out

    @torch.no_grad()
    def _rebase(self, rows: list[TrainingRow], mismatch: Mismatch) -> list[TrainingRow]:
        """``rows`` with the trainer's current logprobs as their old ones (the recorded-vs-trainer difference into
        ``mismatch``)."""
        own: dict[int, list[float]] = {}
        for chunk in self._chunks(rows):
            batch = self._batch(chunk)
            logps = token_logprobs(self.model, batch["input_ids"], batch["attention_mask"])
            mismatch.add(logps, batch["old_logps"], batch["loss_mask"])
            own.update(own_logprobs(chunk, logps))
        return [rebased(r, own[id(r)]) for r in rows]

    @torch.no_grad()
    def _measure(self, rows: list[TrainingRow], mismatch: Mismatch | None = None) -> dict[str, float]:
        """Max |log ratio| against the recorded logprobs and mean entropy on the sampled tokens, without an update."""
        log_ratio, entropy_sum, tokens = 0.0, 0.0, 0.0
        for chunk in self._chunks(rows):
            batch = self._batch(chunk)
            logps, entropy = token_logprobs_and_entropy(self.model, batch["input_ids"], batch["attention_mask"])
            mask = batch["loss_mask"].float()
            if mismatch is not None:
                mismatch.add(logps, batch["old_logps"], batch["loss_mask"])
            if mask.any():
                log_ratio = max(log_ratio, float(((logps - batch["old_logps"]).abs() * mask).max()))
            entropy_sum += float((entropy * mask).sum())
            tokens += float(mask.sum())
        return {"log_ratio_abs_max": log_ratio, "entropy": entropy_sum / tokens if tokens else 0.0}

    def save_state(self, path: Path) -> Path:
        """The optimizer's state, the step count and the random states (row shuffling, torch), so that a resumed
        trainer continues exactly where this one stopped (its weights: :meth:`save`)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        state = {"optimizer": self.optimizer.state_dict(), "steps": self.steps, "rng": self.rng.getstate(),
                 "torch_rng": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        torch.save(state, tmp)
        tmp.replace(path)
        return path

    def load_state(self, path: Path) -> None:
        """Continue from :meth:`save_state` (the trainer must have been built from the checkpoint saved with it)."""
        state = torch.load(Path(path), weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])
        self.rng.setstate(state["rng"])
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])

    @torch.no_grad()
    def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        """Log-probabilities of ``completion_ids`` after ``prompt_ids`` under the current weights (eval mode, no
        gradient): what a server holding these weights should report for them."""
        ids = torch.tensor([[*prompt_ids, *completion_ids]], device=self.device)
        model = self.accelerator.unwrap_model(self.model)
        training = model.training
        model.eval()
        try:
            logps = token_logprobs(model, ids, torch.ones_like(ids))
        finally:
            model.train(training)
        return logps[0, len(prompt_ids):].tolist()

    def save(self, out_dir: Path) -> Path:
        """Write the current policy as a servable checkpoint (weights + the tokenizer files) to ``out_dir``."""
        out_dir = Path(out_dir)
        tmp = out_dir.with_name(out_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model = self.accelerator.unwrap_model(self.model)
        if self.cfg.lora_rank:  # adapters merged: the checkpoint loads and serves without peft
            base_model(model).save_pretrained(tmp, state_dict=merged_state_dict(model), safe_serialization=True)
        elif self.cfg.fsdp and distributed():  # the full state gathered from the shards
            state = self.accelerator.get_state_dict(self.model)
            model.save_pretrained(tmp, state_dict=state, is_main_process=self.accelerator.is_main_process,
                                  safe_serialization=True)
        else:
            model.save_pretrained(tmp, safe_serialization=True)
        copy_extras(self.model_dir, tmp)
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp.rename(out_dir)
        return out_dir

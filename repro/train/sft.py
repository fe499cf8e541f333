"""Supervised warm start with trl's SFTTrainer on demonstration rows (loss on the tokens the expert sampled)."""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from transformers.trainer_callback import PrinterCallback
from trl import SFTConfig as TrlSFTConfig
from trl import SFTTrainer

from repro.common.progress import duration
from repro.train.config import SftConfig
from repro.train.device import base_model, distributed, lora_config, merged_state_dict, resolve_device
from repro.train.objective import TrainingRow
from repro.train.rl import copy_extras
from repro.train.sft_holdout import HoldoutCallback, split_holdout
from repro.train.sft_schedule import GateCallback, GatedDecay, gated_decay, step_cap, with_gated_schedule

IGNORE_INDEX = -100


def rows_dataset(rows: Sequence[TrainingRow], max_length: int = 0) -> Dataset:
    """A pre-tokenized dataset: ``input_ids`` and ``labels`` (-100 on tokens the model did not sample); with
    ``max_length`` > 0 each row keeps its last ``max_length`` tokens (the sampled tokens sit at the end of a row)."""
    keep = slice(-max_length, None) if max_length > 0 else slice(None)
    return Dataset.from_dict({
        "input_ids": [list(r.input_ids)[keep] for r in rows],
        "labels": [[t if m else IGNORE_INDEX for t, m in zip(r.input_ids, r.loss_mask, strict=True)][keep]
                   for r in rows],
    })


class LabelledLogitsSFTTrainer(SFTTrainer):
    """SFTTrainer whose loss projects through the LM head only the positions with a label. trl's fused head does
    that on Triton devices only and scores every position elsewhere, which on a CPU with a large vocabulary
    (Qwen3's 151,669 ids) costs ~20x the compute when a row's sampled tokens are a small part of it."""

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        labels = inputs["labels"][:, 1:]
        mask = labels != IGNORE_INDEX
        hidden = model.get_decoder()(input_ids=inputs["input_ids"], attention_mask=inputs.get("attention_mask"),
                                     use_cache=False).last_hidden_state[:, :-1]
        logits = model.get_output_embeddings()(hidden[mask]).float()
        count = mask.sum() if num_items_in_batch is None else num_items_in_batch
        loss = torch.nn.functional.cross_entropy(logits, labels[mask], reduction="sum") / \
            torch.as_tensor(count).clamp(min=1)
        return (loss, None) if return_outputs else loss


class SftProgress(TrainerCallback):
    """``sft: step 300/1875 (16%), loss 0.412, 1m 36s, ~8m 24s left`` at each logging step, instead of the raw
    log dicts transformers prints. Under a loss-gated schedule (``gate``) the total is the end expected so far,
    with the cap beside it while the decay waits: ``step 300/2813 (11%, at most 5626)``."""

    def __init__(self, gate: GatedDecay | None = None) -> None:
        self.started, self.gate = time.monotonic(), gate

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **_: Any) -> None:
        if not logs or "loss" not in logs or not state.max_steps:
            return
        print(f"sft: {self.line(state.global_step, state.max_steps, logs['loss'])}", flush=True)

    def line(self, done: int, max_steps: int, loss: float) -> str:
        """The progress text after ``done`` steps."""
        total = self.gate.expected_end(done) if self.gate else max_steps
        waiting = f", at most {max_steps}" if self.gate and self.gate.decay_start is None else ""
        elapsed = time.monotonic() - self.started
        left = elapsed * max(0, total - done) / max(done, 1)
        return (f"step {done}/{total} ({done / total:.0%}{waiting}), loss {loss:.3f}, {duration(elapsed)}, "
                f"~{duration(left)} left")


def trained_rows(cfg: SftConfig, n_rows: int) -> int:
    """How many of ``n_rows`` demonstration rows SFT trains on (the rest are held out)."""
    return n_rows - (len(range(0, n_rows, cfg.holdout_every)) if cfg.holdout_every > 0 else 0)


def sft_steps(cfg: SftConfig, n_rows: int) -> int:
    """Optimizer steps of a run on ``n_rows`` demonstration rows (held-out ones excluded)."""
    return max(1, math.ceil(trained_rows(cfg, n_rows) * cfg.epochs / cfg.batch_size))


def planned_steps(cfg: SftConfig, n_rows: int) -> int:
    """The steps to plan for: the epochs' steps, or a gated schedule's cap (an upper bound; the default miniature's
    measured seeds ended within 2% of it)."""
    steps = sft_steps(cfg, n_rows)
    return step_cap(steps, cfg.max_steps_factor) if gate_metric(cfg) else steps


def gate_metric(cfg: SftConfig) -> tuple[str, float] | None:
    """The gated decay's ``(metric, threshold)``, or None for the fixed schedule."""
    if cfg.decay_at_reproduced > 0:
        if cfg.holdout_every <= 0:
            raise ValueError("warm_start.sft.decay_at_reproduced needs held-out rows: set warm_start.sft.holdout_every")
        if cfg.decay_at_loss > 0:
            raise ValueError("set one of warm_start.sft.decay_at_loss and decay_at_reproduced, not both")
        return "reproduced", cfg.decay_at_reproduced
    return ("loss", cfg.decay_at_loss) if cfg.decay_at_loss > 0 else None


def gate_note(cfg: SftConfig, steps: int) -> str:
    """``the decay waits for a loss below 0.6: at most 5626 steps`` (or for a share of held-out later actions
    reproduced) for a gated schedule, else ``""``."""
    gate = gate_metric(cfg)
    if gate is None:
        return ""
    cap = step_cap(steps, cfg.max_steps_factor)
    wait = f"a loss below {gate[1]}" if gate[0] == "loss" else f"{gate[1]:.0%} of held-out later actions reproduced"
    return f"the decay waits for {wait}: at most {cap} steps"


def trl_args(cfg: SftConfig, n_rows: int, work_dir: Path, report_to: str = "none",
             run_name: str | None = None, max_steps: int | None = None) -> TrlSFTConfig:
    """trl's settings; ``report_to``/``run_name``: the tracker transformers logs to (``repro.common.tracking``);
    ``max_steps``: the cap of a loss-gated schedule (:mod:`repro.train.sft_schedule`) instead of the epochs' steps."""
    steps = max_steps or sft_steps(cfg, n_rows)
    decay = max(1, int(steps * cfg.decay_fraction))
    return TrlSFTConfig(
        output_dir=str(work_dir), max_steps=steps, per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate, weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm,
        lr_scheduler_type="warmup_stable_decay", warmup_steps=min(cfg.warmup_steps, steps // 2),
        lr_scheduler_kwargs={"num_decay_steps": decay, "min_lr_ratio": cfg.min_lr_ratio, "decay_type": "linear"},
        bf16=cfg.bf16, use_cpu=resolve_device(cfg.device) == "cpu", seed=cfg.seed, data_seed=cfg.seed,
        logging_steps=cfg.logging_steps,
        save_strategy="no", report_to=report_to, run_name=run_name, disable_tqdm=True, dataloader_num_workers=0,
        max_length=None,
        train_sampling_strategy=cfg.sampling, fsdp=fsdp_option(cfg),
        activation_checkpointing=cfg.gradient_checkpointing,  # trl 1.x's SFTConfig turns it on unless told
    )


def fsdp_option(cfg: SftConfig) -> str:
    """transformers' ``fsdp`` argument: full sharding (plus CPU offload) inside a distributed launch, else off."""
    if not (cfg.fsdp and distributed()):
        return ""
    return "full_shard auto_wrap offload" if cfg.fsdp_offload else "full_shard auto_wrap"


def sft_train(model_dir: Path, rows: Sequence[TrainingRow], out_dir: Path, cfg: SftConfig, report_to: str = "none",
              run_name: str | None = None, callbacks: Sequence[TrainerCallback] = ()) -> dict[str, Any]:
    """Fine-tune the checkpoint in ``model_dir`` on ``rows``; save a servable checkpoint to ``out_dir``;
    ``report_to``: transformers' tracker (inside ``repro.common.tracking.trainer_reporting``)."""
    if not rows:
        raise ValueError("no demonstration rows to train on: did the expert's rollouts record token ids?")
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    metric = gate_metric(cfg)
    rows, held_out = split_holdout(rows, cfg.holdout_every)
    planned = sft_steps(cfg, len(rows) + len(held_out))
    gate = gated_decay(planned, cfg.warmup_steps, cfg.decay_fraction, cfg.min_lr_ratio, metric[1],
                       cfg.max_steps_factor, metric[0]) if metric else None
    args = trl_args(cfg, len(rows), Path(out_dir).with_name(Path(out_dir).name + ".trainer"), report_to, run_name,
                    gate.max_steps if gate else planned)  # planned: the held-out rows already left out, once
    trainer_class = LabelledLogitsSFTTrainer if cfg.labelled_logits else SFTTrainer
    if gate:
        trainer_class = with_gated_schedule(trainer_class)
    trainer = trainer_class(model=model, args=args, train_dataset=rows_dataset(rows, cfg.max_length),
                            processing_class=tokenizer, peft_config=lora_config(cfg))
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(SftProgress(gate))
    holdout = HoldoutCallback(held_out, cfg.holdout_steps, gate, tokenizer.pad_token_id or 0) if held_out else None
    for callback in [*callbacks, *([holdout] if holdout else [])]:
        trainer.add_callback(callback)
    held = f" ({len(held_out)} held out)" if held_out else ""
    if gate:
        trainer.gate = gate
        trainer.add_callback(GateCallback(gate))
        print(f"sft: {len(rows)} rows{held}, {planned} steps of {cfg.batch_size} planned; "
              f"{gate_note(cfg, planned)}", flush=True)
    else:
        print(f"sft: {len(rows)} rows{held}, {args.max_steps} steps of {cfg.batch_size}", flush=True)
    try:
        result = trainer.train()
    finally:
        shutil.rmtree(args.output_dir, ignore_errors=True)  # trl's work folder: no checkpoints are saved there
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    trained = trainer.accelerator.unwrap_model(trainer.model)
    if cfg.lora_rank:  # adapters merged: the checkpoint loads and serves without peft
        base_model(trained).save_pretrained(out_dir, state_dict=merged_state_dict(trained), safe_serialization=True)
    else:
        trained.save_pretrained(out_dir, safe_serialization=True)
    copy_extras(model_dir, out_dir)
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    rates = [e["learning_rate"] for e in trainer.state.log_history if "learning_rate" in e]
    steps = trainer.state.global_step
    tokens = sum(len(r.input_ids) for r in rows) * cfg.epochs * steps / planned
    seconds = time.perf_counter() - started
    return {"rows": len(rows), "steps": steps, "epochs": cfg.epochs * steps / planned, "seconds": seconds,
            "train_loss": result.training_loss, "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None, "tokens_per_s": tokens / max(seconds, 1e-9),
            "learning_rate_last": rates[-1] if rates else None,
            **({"schedule": gate.record()} if gate else {}), **({"holdout": holdout.record()} if holdout else {})}

"""Supervised warm start with trl's SFTTrainer on demonstration rows (loss on the tokens the expert sampled)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig as TrlSFTConfig
from trl import SFTTrainer

from repro.train.config import SftConfig
from repro.train.rl import TrainingRow, copy_extras

IGNORE_INDEX = -100


def rows_dataset(rows: Sequence[TrainingRow]) -> Dataset:
    """A pre-tokenized dataset: ``input_ids`` and ``labels`` (-100 on tokens the model did not sample)."""
    return Dataset.from_dict({
        "input_ids": [list(r.input_ids) for r in rows],
        "labels": [[t if m else IGNORE_INDEX for t, m in zip(r.input_ids, r.loss_mask, strict=True)] for r in rows],
    })


def trl_args(cfg: SftConfig, n_rows: int, work_dir: Path) -> TrlSFTConfig:
    steps = max(1, math.ceil(n_rows * cfg.epochs / cfg.batch_size))
    decay = max(1, int(steps * cfg.decay_fraction))
    return TrlSFTConfig(
        output_dir=str(work_dir), max_steps=steps, per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate, weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm,
        lr_scheduler_type="warmup_stable_decay", warmup_steps=min(cfg.warmup_steps, steps // 2),
        lr_scheduler_kwargs={"num_decay_steps": decay, "min_lr_ratio": cfg.min_lr_ratio, "decay_type": "linear"},
        bf16=cfg.bf16, use_cpu=True, seed=cfg.seed, data_seed=cfg.seed, logging_steps=cfg.logging_steps,
        save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0, max_length=None,
    )


def sft_train(model_dir: Path, rows: Sequence[TrainingRow], out_dir: Path, cfg: SftConfig) -> dict[str, Any]:
    """Fine-tune the checkpoint in ``model_dir`` on ``rows``; save a servable checkpoint to ``out_dir``."""
    if not rows:
        raise ValueError("no demonstration rows to train on: did the expert's rollouts record token ids?")
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    args = trl_args(cfg, len(rows), Path(out_dir).with_name(Path(out_dir).name + ".trainer"))
    trainer = SFTTrainer(model=model, args=args, train_dataset=rows_dataset(rows), processing_class=tokenizer)
    result = trainer.train()
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    copy_extras(model_dir, out_dir)
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    tokens = sum(len(r.input_ids) for r in rows) * cfg.epochs
    seconds = time.perf_counter() - started
    return {"rows": len(rows), "steps": args.max_steps, "epochs": cfg.epochs, "seconds": seconds,
            "train_loss": result.training_loss, "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None, "tokens_per_s": tokens / max(seconds, 1e-9)}

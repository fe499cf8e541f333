"""Warm-start SFT with trl's SFTTrainer: learns the sampled tokens only and writes a servable checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from repro.train.config import SftConfig
from repro.train.sft import IGNORE_INDEX, rows_dataset, sft_train


@dataclass
class Demo:
    input_ids: list[int]
    loss_mask: list[int]


def test_labels_ignore_every_token_the_model_did_not_sample() -> None:
    data = rows_dataset([Demo([5, 6, 7, 8], [0, 1, 0, 1])])
    assert data[0]["labels"] == [IGNORE_INDEX, 6, IGNORE_INDEX, 8]


def test_sft_fits_the_demonstrated_completion(tiny_model_dir: Path, tmp_path: Path) -> None:
    prompt, answer = list(range(10, 30)), [40, 41, 42, 43, 44, 45]
    rows = [Demo(prompt + answer, [0] * len(prompt) + [1] * len(answer))] * 64
    stats = sft_train(tiny_model_dir, rows, tmp_path / "warm", SftConfig(epochs=4, batch_size=8, learning_rate=1e-2,
                                                                       warmup_steps=2, logging_steps=4))
    assert stats["steps"] == 32 and stats["loss_last"] < stats["loss_first"]
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "warm")
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + answer[:-1]])).logits[0, len(prompt) - 1 :]
    assert logits.argmax(-1).tolist() == answer
    assert (tmp_path / "warm" / "tokenizer.json").exists()


def _padded_tokens(model_dir: Path, work: Path, rows: list[Demo], sampling: str) -> int:
    from transformers import AutoTokenizer
    from trl import SFTTrainer

    from repro.train.sft import trl_args

    cfg = SftConfig(epochs=1, batch_size=8, sampling=sampling)
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), args=trl_args(cfg, len(rows), work),
                         train_dataset=rows_dataset(rows), processing_class=AutoTokenizer.from_pretrained(model_dir))
    return sum(batch["input_ids"].numel() for batch in trainer.get_train_dataloader())


def test_group_by_length_batches_rows_of_similar_length(tiny_model_dir: Path, tmp_path: Path) -> None:
    rows = [Demo([7] * n, [1] * n) for n in [12, 96] * 32]  # half short, half long rows
    real = sum(len(r.input_ids) for r in rows)
    grouped = _padded_tokens(tiny_model_dir, tmp_path / "grouped", rows, "group_by_length")
    shuffled = _padded_tokens(tiny_model_dir, tmp_path / "random", rows, "random")
    # sorted within the mega-batch: at most one batch mixes short and long rows (the sampler moves the longest row
    # to the front); in random order nearly every batch of 8 holds a long row
    assert grouped <= real + 8 * (96 - 12) < shuffled

"""Warm-start SFT with trl's SFTTrainer: learns the sampled tokens only and writes a servable checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from repro.train.config import SftConfig
from repro.train.sft import IGNORE_INDEX, LabelledLogitsSFTTrainer, rows_dataset, sft_steps, sft_train


@dataclass
class Demo:
    input_ids: list[int]
    loss_mask: list[int]


def test_labels_ignore_every_token_the_model_did_not_sample() -> None:
    data = rows_dataset([Demo([5, 6, 7, 8], [0, 1, 0, 1])])
    assert data[0]["labels"] == [IGNORE_INDEX, 6, IGNORE_INDEX, 8]


def test_max_length_keeps_the_end_of_each_row() -> None:
    """Left truncation keeps the sampled tokens (a row's end) and their labels aligned; shorter rows stay whole."""
    data = rows_dataset([Demo([1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 0, 1]), Demo([7, 8], [0, 1])], max_length=3)
    assert data[0]["input_ids"] == [4, 5, 6] and data[0]["labels"] == [4, IGNORE_INDEX, 6]
    assert data[1]["input_ids"] == [7, 8] and data[1]["labels"] == [IGNORE_INDEX, 8]


def test_labelled_logits_loss_is_the_models_own_loss(tiny_model_dir: Path) -> None:
    """The LM head on labelled positions only gives the same mean loss (and gradient) as the full logits."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = torch.tensor([[5, 9, 14, 3, 7, 21, 8, 2], [11, 12, 13, 14, 15, 16, 17, 18]])
    labels = ids.clone()
    labels[0, :4], labels[1, :6] = IGNORE_INDEX, IGNORE_INDEX
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    loss = LabelledLogitsSFTTrainer.compute_loss(None, model, dict(inputs))  # uses no trainer state
    grad = torch.autograd.grad(loss, model.get_output_embeddings().weight)[0]
    reference = model(input_ids=ids, labels=labels).loss
    assert torch.allclose(loss, reference, atol=1e-5)
    assert torch.allclose(grad, torch.autograd.grad(reference, model.get_output_embeddings().weight)[0], atol=1e-6)


@pytest.mark.parametrize("labelled_logits", [False, True])
def test_sft_fits_the_demonstrated_completion(tiny_model_dir: Path, tmp_path: Path, labelled_logits: bool) -> None:
    prompt, answer = list(range(10, 30)), [40, 41, 42, 43, 44, 45]
    rows = [Demo(prompt + answer, [0] * len(prompt) + [1] * len(answer))] * 64
    stats = sft_train(tiny_model_dir, rows, tmp_path / "warm", SftConfig(epochs=4, batch_size=8, learning_rate=1e-2,
                                                                       warmup_steps=2, logging_steps=4,
                                                                       labelled_logits=labelled_logits))
    assert stats["steps"] == 32 and stats["loss_last"] < stats["loss_first"]
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "warm")
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + answer[:-1]])).logits[0, len(prompt) - 1 :]
    assert logits.argmax(-1).tolist() == answer
    assert (tmp_path / "warm" / "tokenizer.json").exists()


def test_a_fixed_schedule_with_held_out_rows_runs_the_steps_it_plans(tiny_model_dir: Path, tmp_path: Path) -> None:
    rows = [Demo(list(range(10, 20)), [0] * 5 + [1] * 5)] * 20
    cfg = SftConfig(epochs=1, batch_size=4, warmup_steps=1, holdout_every=4, holdout_steps=100)
    stats = sft_train(tiny_model_dir, rows, tmp_path / "warm", cfg)
    assert stats["rows"] == 15 and stats["steps"] == 4 == sft_steps(cfg, 20)  # ceil(15 / 4): 5 held out, once


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


@pytest.mark.parametrize("on", [False, True])
def test_gradient_checkpointing_is_what_the_config_says(tmp_path: Path, on: bool) -> None:
    """trl's SFTConfig checkpoints by default: off must be passed, or every CPU step recomputes its forward (~20%
    of a step of the miniature's SFT, py-spy)."""
    from repro.train.sft import trl_args

    args = trl_args(SftConfig(gradient_checkpointing=on), 8, tmp_path / "work")
    assert args.activation_checkpointing is on and args.gradient_checkpointing is on

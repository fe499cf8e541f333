"""The one trainer's device settings (repro.train.config.DeviceSettings, applied by repro.train.device): the CPU
defaults are a plain torch loop, bit for bit; LoRA trains adapters only and saves merged weights that load without
peft; gradient checkpointing changes memory, not the update; a GPU asked for where there is none is a clear error."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from repro.testing import FakeTrainingRow
from repro.train.batching import micro_batches
from repro.train.config import DeviceSettings, SftConfig, UpdateConfig, non_default_device_settings
from repro.train.device import resolve_device
from repro.train.objective import clipped_policy_loss, pad_rows, token_logprobs_and_entropy
from repro.train.rl import PolicyTrainer
from repro.train.sft import sft_train

CFG = {"learning_rate": 1e-3, "updates_per_batch": 2, "micro_batch_rows": 4, "on_policy_log_ratio_max": 0.0}


def _rows() -> list[FakeTrainingRow]:
    return [FakeTrainingRow([1 + i, 2, 3 + i, 4, 5 + i % 7, 6, 7 + i], 1.0 if i % 2 else -1.0) for i in range(6)]


def _reference_update(model_dir: Path, rows: list[FakeTrainingRow], cfg: UpdateConfig) -> dict[str, torch.Tensor]:
    """The update written as a plain torch loop (no accelerate): what the defaults must reproduce exactly."""
    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, betas=cfg.adam_betas, weight_decay=0.0)
    rng, normalizer = random.Random(cfg.seed), sum(r.weight for r in rows)
    for _ in range(cfg.updates_per_batch):
        order = list(rows)
        rng.shuffle(order)
        optimizer.zero_grad(set_to_none=True)
        for cut in micro_batches(order, cfg.micro_batch_rows, cfg.micro_batch_tokens):
            batch = pad_rows([order[i] for i in cut], model.config.pad_token_id or 0)
            logps, _ = token_logprobs_and_entropy(model, batch["input_ids"], batch["attention_mask"])
            loss, _ = clipped_policy_loss(logps, batch["old_logps"], batch["advantages"], batch["loss_mask"],
                                          batch["weights"], normalizer, cfg.clip_low, cfg.clip_high)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        optimizer.step()
    return model.state_dict()


def _saved(path: Path) -> dict[str, torch.Tensor]:
    return load_file(path / "model.safetensors")


def test_cpu_defaults_are_the_plain_torch_loop_bit_for_bit(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = UpdateConfig(**CFG)
    trainer = PolicyTrainer(tiny_model_dir, cfg)
    assert trainer.device.type == "cpu"
    trainer.update(_rows())
    saved = _saved(trainer.save(tmp_path / "out"))
    reference = _reference_update(tiny_model_dir, _rows(), cfg)
    assert saved.keys() <= reference.keys()
    for name, value in saved.items():
        assert torch.equal(value, reference[name]), name


def _logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits


def test_lora_trains_adapters_only_and_saves_merged_weights_that_load_without_peft(tiny_model_dir: Path,
                                                                                  tmp_path: Path) -> None:
    pytest.importorskip("peft", reason="LoRA needs the lora extra (peft)")
    trainer = PolicyTrainer(tiny_model_dir, UpdateConfig(**{**CFG, "learning_rate": 5e-2}, lora_rank=4, lora_alpha=8))
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    base_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    trainer.update(_rows())
    assert all(torch.equal(p, base_before[n]) for n, p in trainer.model.named_parameters() if not p.requires_grad)

    out = trainer.save(tmp_path / "merged")
    assert not any("lora" in key or "base_layer" in key for key in _saved(out))
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    trainer.model.eval()
    ids = [1, 2, 3, 4, 5, 6]
    assert torch.allclose(_logits(merged, ids), _logits(trainer.model, ids), atol=1e-5)
    assert not torch.allclose(_logits(merged, ids), _logits(original, ids), atol=1e-4)


def test_gradient_checkpointing_changes_memory_not_the_update(tiny_model_dir: Path, tmp_path: Path) -> None:
    plain = PolicyTrainer(tiny_model_dir, UpdateConfig(**CFG))
    checkpointed = PolicyTrainer(tiny_model_dir, UpdateConfig(**CFG, gradient_checkpointing=True))
    assert checkpointed.model.is_gradient_checkpointing
    plain.update(_rows())
    checkpointed.update(_rows())
    a, b = _saved(plain.save(tmp_path / "a")), _saved(checkpointed.save(tmp_path / "b"))
    for name, value in a.items():
        assert torch.allclose(value, b[name], atol=1e-6), name


def test_a_gpu_asked_for_where_there_is_none_is_a_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="torch sees no GPU"):
        resolve_device("cuda")
    assert resolve_device("auto") == "cpu"
    with pytest.raises(ValueError, match="device must be one of"):
        UpdateConfig(device="tpu")
    with pytest.raises(ValueError, match="lora_rank"):
        SftConfig(lora_rank=-1)


def test_device_settings_at_their_defaults_stay_out_of_cache_keys() -> None:
    assert non_default_device_settings({"epochs": 2.0, **vars(DeviceSettings())}) == {"epochs": 2.0, "bf16": False}
    assert non_default_device_settings({"lora_rank": 8, "device": "cpu"}) == {"lora_rank": 8}


def test_sft_with_lora_saves_a_merged_servable_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("peft", reason="LoRA needs the lora extra (peft)")
    rows = [FakeTrainingRow([1 + i, 2, 3, 4, 5, 6], 0.0) for i in range(8)]
    cfg = SftConfig(epochs=2.0, batch_size=4, learning_rate=5e-2, warmup_steps=0, logging_steps=1, lora_rank=4)
    stats = sft_train(tiny_model_dir, rows, tmp_path / "sft", cfg)
    assert stats["steps"] == 4
    assert not any("lora" in key for key in _saved(tmp_path / "sft"))
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "sft", dtype=torch.float32).eval()
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    assert not torch.allclose(_logits(merged, [1, 2, 3]), _logits(original, [1, 2, 3]), atol=1e-4)

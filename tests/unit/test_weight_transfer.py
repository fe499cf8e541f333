"""Carrying a trained checkpoint into a recipe tokenizer with more added tokens (repro.train.transfer)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from repro.tinymodel.model import TinyModelConfig, build_tiny_model
from repro.train.transfer import carry_weights

SHAPE = dict(vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
             max_position_embeddings=256)
SHARED = "sed -i 'Ns|old|new|' file.py"
NEW = "# a fixed paragraph of another harness"  # sorts before SHARED: SHARED's id moves by one


def _checkpoint(path: Path, extra: list[str], seed: int, **shape: int) -> Path:
    return build_tiny_model(path, TinyModelConfig(seed=seed, extra_added_tokens=extra, **{**SHAPE, **shape}), [])


def _trained(path: Path) -> Path:
    """A stand-in for a trained checkpoint: weights unlike any fresh initialisation."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    model.save_pretrained(path)
    return path


def test_carries_every_weight_and_each_token_row_by_text(tmp_path: Path) -> None:
    source = _trained(_checkpoint(tmp_path / "source", [SHARED], seed=1))
    target = _checkpoint(tmp_path / "target", [SHARED, NEW], seed=2)
    counts = carry_weights(source, target, tmp_path / "out")
    src_tok, out_tok = AutoTokenizer.from_pretrained(source), AutoTokenizer.from_pretrained(tmp_path / "out")
    assert src_tok.convert_tokens_to_ids(SHARED) != out_tok.convert_tokens_to_ids(SHARED)  # a copy by id is wrong
    assert counts == {"carried_tokens": len(src_tok), "new_tokens": 1}

    src = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    out = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    src_emb, out_emb = src.get_input_embeddings().weight, out.get_input_embeddings().weight
    assert torch.equal(out_emb[out_tok.convert_tokens_to_ids(SHARED)], src_emb[src_tok.convert_tokens_to_ids(SHARED)])
    assert torch.allclose(out_emb[out_tok.convert_tokens_to_ids(NEW)], src_emb.mean(dim=0))
    src_params = dict(src.named_parameters())
    for name, param in out.named_parameters():
        if "embed" not in name:
            assert torch.equal(param, src_params[name]), name

    text = f"<|im_start|>user\nfix it<|im_end|>\n<|im_start|>assistant\n{SHARED}"  # the same text, both tokenizers
    src_ids, out_ids = src_tok(text, return_tensors="pt").input_ids, out_tok(text, return_tensors="pt").input_ids
    with torch.no_grad():
        src_logits, out_logits = src(src_ids).logits[0], out(out_ids).logits[0]
    shared_ids = [out_tok.convert_tokens_to_ids(t) for t in src_tok.convert_ids_to_tokens(range(len(src_tok)))]
    assert torch.allclose(out_logits[:, shared_ids], src_logits[:, : len(src_tok)], atol=1e-4)


def test_models_of_another_shape_are_refused(tmp_path: Path) -> None:
    source = _checkpoint(tmp_path / "source", [SHARED], seed=1)
    target = _checkpoint(tmp_path / "target", [SHARED], seed=1, hidden_size=64)
    with pytest.raises(ValueError, match="different shapes"):
        carry_weights(source, target, tmp_path / "out")

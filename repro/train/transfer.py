"""Carry a trained checkpoint into a model of the same shape with another vocabulary (a recipe tokenizer with more
added tokens): every weight but the token embeddings as it is, each embedding row by its token's text, and a token
the source lacks at the mean of the source's rows (the new row's logit starts at an average token's, so nothing new
is favoured before training sees it).

The mixed warm start uses it to start from a single-harness warm start that has already learned to copy from its
observations (:mod:`repro.recipe.warm_start_mix`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from repro.train.rl import copy_extras


def _embedding_names(model: Any) -> set[str]:
    """The parameter names holding the input embeddings and (untied) the LM head."""
    tensors = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    return {name for name, p in model.named_parameters(remove_duplicate=False) if id(p) in tensors}


def _check_shapes(source: Any, target: Any, skip: set[str]) -> None:
    src, dst = dict(source.named_parameters()), dict(target.named_parameters())
    missing = sorted(set(dst) - set(src) - skip)
    wrong = sorted(n for n in set(dst) & set(src) - skip if src[n].shape != dst[n].shape)
    if missing or wrong:
        raise ValueError(f"cannot carry weights between models of different shapes: missing {missing[:3]}, "
                         f"different shapes {wrong[:3]} (the two checkpoints need the same model settings)")


@torch.no_grad()
def _carry_rows(source: torch.Tensor, target: torch.Tensor, src_vocab: dict[str, int],
                dst_vocab: dict[str, int]) -> int:
    """Copy ``source``'s row of each token into ``target``'s row of the same token; the rest get the mean row."""
    mean = source.mean(dim=0)
    carried = 0
    for token, row in dst_vocab.items():
        if row >= target.shape[0]:
            continue
        j = src_vocab.get(token)
        target[row] = source[j] if j is not None and j < source.shape[0] else mean
        carried += j is not None
    return carried


@torch.no_grad()
def carry_weights(source_dir: Path, target_base: Path, out_dir: Path) -> dict[str, int]:
    """Write to ``out_dir`` the model of ``target_base`` (its config and tokenizer) holding ``source_dir``'s
    weights; how many vocabulary rows were carried and how many are new."""
    source = AutoModelForCausalLM.from_pretrained(source_dir, dtype=torch.float32)
    target = AutoModelForCausalLM.from_pretrained(target_base, dtype=torch.float32)
    skip = _embedding_names(target)
    _check_shapes(source, target, skip)
    src_params = dict(source.named_parameters())
    for name, param in target.named_parameters():
        if name not in skip:
            param.copy_(src_params[name])
    src_vocab = AutoTokenizer.from_pretrained(source_dir).get_vocab()
    dst_vocab = AutoTokenizer.from_pretrained(target_base).get_vocab()
    carried = _carry_rows(source.get_input_embeddings().weight, target.get_input_embeddings().weight,
                          src_vocab, dst_vocab)
    head = target.get_output_embeddings().weight
    if head.data_ptr() != target.get_input_embeddings().weight.data_ptr():
        _carry_rows(source.get_output_embeddings().weight, head, src_vocab, dst_vocab)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    target.save_pretrained(out_dir, safe_serialization=True)
    copy_extras(target_base, out_dir)
    return {"carried_tokens": carried, "new_tokens": len(dst_vocab) - carried}

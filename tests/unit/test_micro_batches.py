"""RL micro-batches grouped by length: every row once, within the row and token caps, and the same update as one
forward pass over all rows (the loss is a sum over rows with a fixed normalizer)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.testing import FakeTrainingRow
from repro.train.batching import micro_batches
from repro.train.config import UpdateConfig
from repro.train.rl import PolicyTrainer


class _Sized:
    def __init__(self, n: int) -> None:
        self.input_ids = [0] * n


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 300), max_size=60), max_rows=st.integers(1, 40),
       max_tokens=st.sampled_from([0, 1, 64, 500, 4096]))
def test_every_row_once_within_the_caps(lengths: list[int], max_rows: int, max_tokens: int) -> None:
    rows = [_Sized(n) for n in lengths]
    batches = micro_batches(rows, max_rows, max_tokens)
    assert sorted(i for b in batches for i in b) == list(range(len(rows)))
    for batch in batches:
        assert 1 <= len(batch) <= max_rows
        width = max(lengths[i] for i in batch)
        if max_tokens and len(batch) > 1:
            assert len(batch) * width <= max_tokens
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(flat)  # shortest first: a long row pads only rows of its own length class


def test_a_long_row_pads_no_short_ones() -> None:
    rows = [_Sized(10)] * 31 + [_Sized(1000)]
    batches = micro_batches(rows, 32, 2048)
    assert [31] in batches  # the long row goes alone
    padded = sum(len(b) * max(len(rows[i].input_ids) for i in b) for b in batches)
    assert padded == 31 * 10 + 1000  # instead of 32 x 1000 in one shuffled micro-batch


def test_ties_keep_the_given_order() -> None:
    rows = [_Sized(5), _Sized(3), _Sized(5), _Sized(3)]
    assert micro_batches(rows, 8, 0) == [[1, 3, 0, 2]]


@pytest.mark.parametrize(("max_rows", "max_tokens"), [(0, 0), (4, -1)])
def test_bad_caps_are_refused(max_rows: int, max_tokens: int) -> None:
    with pytest.raises(ValueError, match="micro_batch"):
        micro_batches([_Sized(3)], max_rows, max_tokens)
    with pytest.raises(ValueError, match="micro_batch"):
        UpdateConfig(micro_batch_rows=max_rows, micro_batch_tokens=max_tokens)


def _rows() -> list[FakeTrainingRow]:
    return [FakeTrainingRow([1 + i % 9, 2] + [3 + (i * j) % 11 for j in range(3 + 5 * (i % 4))],
                            1.0 if i % 3 else -1.0) for i in range(12)]


def _gradient(model_dir: Path, **cut: int) -> dict[str, torch.Tensor]:
    """The gradient of one update (left on the parameters after the optimizer step; Adam's first step, about
    lr * sign(g), would magnify float noise in near-zero entries, so the gradient is what is compared)."""
    cfg = UpdateConfig(learning_rate=1e-3, updates_per_batch=1, on_policy_log_ratio_max=0.0, **cut)
    trainer = PolicyTrainer(model_dir, cfg)
    trainer.update(_rows())
    return {name: p.grad.clone() for name, p in trainer.model.named_parameters() if p.grad is not None}


def test_the_cut_does_not_change_the_gradient(tiny_model_dir: Path) -> None:
    whole = _gradient(tiny_model_dir, micro_batch_rows=64, micro_batch_tokens=0)
    cut = _gradient(tiny_model_dir, micro_batch_rows=3, micro_batch_tokens=40)
    assert whole.keys() == cut.keys()
    assert any(float(g.abs().max()) > 0 for g in whole.values())  # the update did something
    for name, value in whole.items():
        torch.testing.assert_close(cut[name], value, rtol=1e-4, atol=1e-7, msg=name)

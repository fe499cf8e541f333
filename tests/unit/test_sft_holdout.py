"""Held-out reproduction of demonstrations: spans are the sampled runs, the split is disjoint and complete, and an
action counts only when every one of its tokens is the greedy one."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import torch
from hypothesis import given
from hypothesis import strategies as st

from repro.train.sft_holdout import action_spans, score_holdout, split_holdout


@dataclass
class Row:
    input_ids: list[int]
    loss_mask: list[int]


class Oracle(torch.nn.Module):
    """A 'model' whose greedy next token at position t is ``answers[row][t + 1]`` (one-hot hidden states through an
    identity head), so a test decides exactly which positions it gets right."""

    def __init__(self, answers: dict[tuple[int, ...], list[int]], vocab: int = 16) -> None:
        super().__init__()
        self.answers, self.vocab = answers, vocab
        self.head = torch.nn.Identity()

    def get_decoder(self) -> Oracle:
        return self

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, use_cache: bool) -> object:
        out = torch.zeros((*input_ids.shape, self.vocab))
        for i, ids in enumerate(input_ids.tolist()):
            length = int(attention_mask[i].sum())
            target = self.answers[tuple(ids[:length])]
            for t in range(length - 1):
                out[i, t, target[t + 1]] = 1.0
        return type("Out", (), {"last_hidden_state": out})()


@given(st.lists(st.integers(0, 1), max_size=40))
def test_spans_cover_exactly_the_labelled_positions_in_order(mask: list[int]) -> None:
    spans = action_spans(mask)
    assert [t for a, b in spans for t in range(a, b)] == [t for t, m in enumerate(mask) if m]
    assert all(b < c for (_, b), (c, _) in pairwise(spans))  # separated: maximal runs


@given(st.integers(0, 60), st.integers(-1, 7))
def test_the_split_is_disjoint_complete_and_ordered(n: int, every: int) -> None:
    rows = [Row([i], [1]) for i in range(n)]
    train, held = split_holdout(rows, every)
    assert sorted([r.input_ids[0] for r in train + held]) == list(range(n))
    assert [r.input_ids for r in train] == sorted(r.input_ids for r in train)
    assert len(held) == (0 if every <= 0 else len(range(0, n, every)))


def test_an_action_counts_only_when_all_its_tokens_are_right() -> None:
    # row: prompt 1 2 | action 3 4 | observation 5 | action 6 7 | observation 8 | action 9
    row = Row([1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 0, 1, 1, 0, 1, 1, 0, 1])
    perfect = Oracle({tuple(row.input_ids): row.input_ids})
    assert score_holdout(perfect, [row]).as_dict() == {"actions": 1.0, "later_actions": 1.0, "tokens": 1.0}
    one_wrong = list(row.input_ids)
    one_wrong[6] = 0  # the second action's last token
    score = score_holdout(Oracle({tuple(row.input_ids): one_wrong}), [row])
    assert (score.actions, score.later_actions, score.tokens) == (2 / 3, 1 / 2, 4 / 5)


def test_rows_of_other_lengths_batch_together_and_the_mode_is_restored() -> None:
    short, long = Row([1, 2, 3], [0, 0, 1]), Row([4, 5, 6, 7, 8], [0, 1, 1, 0, 1])
    wrong = [4, 5, 0, 7, 8]
    model = Oracle({(1, 2, 3): short.input_ids, (4, 5, 6, 7, 8): wrong})
    model.train()
    score = score_holdout(model, [short, long], batch_size=2, pad_id=0)
    assert (score.actions, score.tokens) == (2 / 3, 3 / 4) and model.training

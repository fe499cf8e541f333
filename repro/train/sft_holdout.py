"""Held-out demonstrations for SFT: does the model reproduce the expert's actions it did not train on?

The training loss mixes the tokens a model learns early (the command's shape, the task's wording) with the ones it
learns last (the line number and the code it must copy from an earlier observation). A warm start can reach a low
loss and still not copy: on the miniature a seed's loss went to 0.30 and it resolved 0 of 200 held-out tasks. The
measure here is direct: teacher-forced on held-out rows, an **action** (a contiguous run of sampled tokens, one
assistant turn) counts as reproduced when the greedy token at each of its positions is the expert's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import TrainerCallback


class Row(Protocol):
    input_ids: Sequence[int]
    loss_mask: Sequence[int]


def action_spans(mask: Sequence[int]) -> list[tuple[int, int]]:
    """The ``[start, end)`` runs of labelled positions in ``mask``, in order."""
    spans, start = [], None
    for i, m in enumerate(mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(mask)))
    return spans


def split_holdout(rows: Sequence[Row], every: int) -> tuple[list[Row], list[Row]]:
    """``(train, held_out)``: every ``every``-th row (from the first) is held out; ``every`` <= 0 holds none."""
    if every <= 0:
        return list(rows), []
    held = [r for i, r in enumerate(rows) if i % every == 0]
    return [r for i, r in enumerate(rows) if i % every], held


@dataclass(frozen=True)
class HoldoutScore:
    """What a model reproduced of the held-out rows: ``actions`` (share of actions wholly reproduced),
    ``later_actions`` (the same over actions after a row's first: the ones that copy from an observation) and
    ``tokens`` (share of sampled tokens)."""

    actions: float
    later_actions: float
    tokens: float

    def as_dict(self) -> dict[str, float]:
        return {"actions": self.actions, "later_actions": self.later_actions, "tokens": self.tokens}


def _greedy_hits(model: Any, rows: Sequence[Row], pad_id: int) -> list[dict[int, bool]]:
    """Per row, for each labelled position, whether the greedy token there equals the label (rows right-padded)."""
    width = max(len(r.input_ids) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r.input_ids)] = torch.as_tensor(list(r.input_ids))
        attention[i, : len(r.input_ids)] = 1
    hidden = model.get_decoder()(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state
    hits = []
    for i, r in enumerate(rows):
        labelled = [t for t, m in enumerate(r.loss_mask) if m and t > 0]
        if not labelled:
            hits.append({})
            continue
        positions = torch.as_tensor(labelled, dtype=torch.long)
        guess = model.get_output_embeddings()(hidden[i, positions - 1]).argmax(-1)
        hits.append(dict(zip(labelled, (guess == ids[i, positions]).tolist(), strict=True)))
    return hits


@torch.no_grad()
def score_holdout(model: Any, rows: Sequence[Row], batch_size: int = 16, pad_id: int = 0) -> HoldoutScore:
    """Teacher-forced reproduction of ``rows`` by ``model`` (put back in its training mode afterwards)."""
    if not rows:
        raise ValueError("no held-out rows to score")
    was_training = model.training
    model.eval()
    actions = later = actions_hit = later_hit = tokens = tokens_hit = 0
    try:
        for start in range(0, len(rows), batch_size):
            batch = rows[start: start + batch_size]
            for row, hits in zip(batch, _greedy_hits(model, batch, pad_id), strict=True):
                for n, (a, b) in enumerate(action_spans(row.loss_mask)):
                    whole = all(hits.get(t, False) for t in range(a, b))
                    actions, actions_hit = actions + 1, actions_hit + whole
                    if n:
                        later, later_hit = later + 1, later_hit + whole
                tokens, tokens_hit = tokens + len(hits), tokens_hit + sum(hits.values())
    finally:
        model.train(was_training)
    return HoldoutScore(actions_hit / max(actions, 1), later_hit / max(later, 1), tokens_hit / max(tokens, 1))


class HoldoutCallback(TrainerCallback):
    """Scores the held-out rows every ``every`` steps and at the end (``history``: ``[step, actions, later, tokens]``);
    with a ``reproduced`` ``gate``, feeds it the lower of the last two scores of the later actions, so that one lucky
    score does not start the decay."""

    def __init__(self, rows: Sequence[Row], every: int, gate: Any = None, pad_id: int = 0) -> None:
        if every <= 0:
            raise ValueError(f"held-out scoring needs a positive step interval, not {every}")
        self.rows, self.every, self.gate, self.pad_id = list(rows), every, gate, pad_id
        self.history: list[list[float]] = []

    def score(self, step: int, model: Any) -> HoldoutScore:
        score = score_holdout(model, self.rows, pad_id=self.pad_id)
        self.history.append([step, score.actions, score.later_actions, score.tokens])
        print(f"sft: held out at step {step}: {score.later_actions:.1%} of later actions reproduced "
              f"(all actions {score.actions:.1%}, tokens {score.tokens:.1%})", flush=True)
        return score

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
        if state.global_step % self.every:
            return
        self.score(state.global_step, model)
        if self.gate is not None and self.gate.metric == "reproduced" and len(self.history) >= 2:
            self.gate.observe(state.global_step, min(self.history[-1][2], self.history[-2][2]))

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
        if not self.history or self.history[-1][0] != state.global_step:
            self.score(state.global_step, model)

    def record(self) -> dict[str, Any]:
        """The final score and the trajectory, for the warm start's record."""
        step, actions, later, tokens = self.history[-1]
        return {"rows": len(self.rows), "every": self.every, "final": {"step": step, "actions": actions,
                "later_actions": later, "tokens": tokens}, "history": self.history}

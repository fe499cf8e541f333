"""The clipped policy-gradient objective and what it is computed on: the rows' tensors, the trainer's own
logprobs of the sampled tokens (and their entropy), the checks that the rows are on policy.

Per token: ``max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))`` with ``r = exp(logp - old_logp)``, the
importance ratio against the logprob the model server recorded when it sampled the token; per row the mean over its
sampled tokens; per batch the rows weighted by ``weights`` and divided by ``normalizer``. With ``clip_ratio_c`` > 1
(dual-clip PPO) a negative advantage's per-token loss is further capped at ``-A * clip_ratio_c``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from trl.trainer.utils import entropy_from_logits, selective_log_softmax


class TrainingRow(Protocol):
    """What the trainer reads from a row of ``repro.train.samples`` (token lists are aligned)."""

    input_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    weight: float
    advantage: float


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Log-probability of each token given the ones before it; position 0 gets 0 (shape = ``input_ids``)."""
    return token_logprobs_and_entropy(model, input_ids, attention_mask, with_entropy=False)[0]


def token_logprobs_and_entropy(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                               with_entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(:func:`token_logprobs`, the entropy of the distribution each token was drawn from, without gradient, or
    None when not ``with_entropy``); position 0 gets 0."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    logps = torch.nn.functional.pad(selective_log_softmax(logits, input_ids[:, 1:]), (1, 0))
    if not with_entropy:
        return logps, None
    with torch.no_grad():
        entropy = torch.nn.functional.pad(entropy_from_logits(logits), (1, 0))
    return logps, entropy


def clipped_policy_loss(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor,
                        loss_mask: torch.Tensor, weights: torch.Tensor, normalizer: float,
                        clip_low: float = 0.2, clip_high: float = 0.28,
                        clip_ratio_c: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
    """(loss, stats) for a padded batch: ``logps``/``old_logps``/``loss_mask`` are (rows, tokens); ``advantages``
    and ``weights`` are (rows,). Padding and unsampled tokens must have mask 0. ``clip_ratio_c`` > 0: dual clip
    (stats then also hold ``dual_clip_fraction``, the sampled tokens whose loss the cap lowered)."""
    mask = loss_mask.float()
    ratio = torch.exp((logps - old_logps) * mask)
    adv = advantages.unsqueeze(1)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    dual = None
    if clip_ratio_c:
        cap = -adv * clip_ratio_c
        dual = (adv < 0) & (per_token > cap)
        per_token = torch.where(adv < 0, torch.minimum(per_token, cap), per_token)
    per_row = (per_token * mask).sum(1) / mask.sum(1).clamp(min=1.0)
    loss = (per_row * weights).sum() / normalizer
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        was_clipped = ((clipped > unclipped) & (mask > 0)).float().sum() / n
        stats = {"clip_fraction": float(was_clipped),
                 "ratio_mean": float((ratio * mask).sum() / n),
                 "log_ratio_abs_max": float(((logps - old_logps).abs() * mask).max()) if mask.any() else 0.0}
        if dual is not None:
            stats["dual_clip_fraction"] = float((dual & (mask > 0)).float().sum() / n)
    return loss, stats


def pad_rows(rows: Sequence[TrainingRow], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded tensors of a micro-batch."""
    width = max(len(r.input_ids) for r in rows)

    def padded(values: list, fill: float, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(list(values) + [fill] * (width - len(values)), dtype=dtype)

    return {
        "input_ids": torch.stack([padded(r.input_ids, pad_id, torch.long) for r in rows]),
        "attention_mask": torch.stack([padded([1] * len(r.input_ids), 0, torch.long) for r in rows]),
        "loss_mask": torch.stack([padded(r.loss_mask, 0, torch.long) for r in rows]),
        "old_logps": torch.stack([padded(r.old_logprobs, 0.0, torch.float32) for r in rows]),
        "advantages": torch.tensor([r.advantage for r in rows], dtype=torch.float32),
        "weights": torch.tensor([r.weight for r in rows], dtype=torch.float32),
    }


def check_rows(rows: Sequence[TrainingRow]) -> None:
    """Refuse rows the objective cannot use: misaligned lists or missing sampling logprobs."""
    for row in rows:
        if not len(row.input_ids) == len(row.loss_mask) == len(row.old_logprobs):
            raise ValueError("a row's input_ids, loss_mask and old_logprobs differ in length")
        sampled = [lp for lp, m in zip(row.old_logprobs, row.loss_mask, strict=True) if m]
        if any(lp != lp for lp in sampled):  # NaN marks a logprob the server did not return
            raise ValueError("a row has sampled tokens without recorded logprobs; the importance ratio needs them "
                             "(the model server must return logprobs)")


class OffPolicyError(RuntimeError):
    """The first update of a batch found the trainer's policy is not the one that sampled the batch."""


def check_on_policy(log_ratio_abs_max: float, bound: float) -> None:
    """Fail when the recorded sampling logprobs and the trainer's differ by more than ``bound`` (0: no check)."""
    if bound > 0 and not log_ratio_abs_max <= bound:
        raise OffPolicyError(
            f"the first update's max |log ratio| is {log_ratio_abs_max:.3g} > trainer.on_policy_log_ratio_max="
            f"{bound:g}: the model server's recorded logprobs are not the trainer's for the same weights (weights "
            "not synced to the server, sampling at a temperature or top_p other than 1, or a server that returns "
            "logprobs of another distribution); raise the bound only for a known, measured mismatch (e.g. bf16 "
            "serving)")


@dataclass
class Mismatch:
    """|recorded sampling logprob - trainer's logprob| over sampled tokens: its max and sum."""

    max: float = 0.0
    total: float = 0.0
    tokens: int = 0

    def add(self, logps: torch.Tensor, recorded: torch.Tensor, loss_mask: torch.Tensor) -> None:
        with torch.no_grad():
            mask = loss_mask > 0
            if mask.any():
                diff = (logps.detach() - recorded).abs()[mask]
                self.max = max(self.max, float(diff.max()))
                self.total += float(diff.double().sum())
                self.tokens += int(mask.sum())

    @property
    def mean(self) -> float:
        return self.total / self.tokens if self.tokens else 0.0


@dataclass
class RebasedRow:
    """A row whose old logprobs are the trainer's own (``old_logprobs=recompute``)."""

    input_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    weight: float
    advantage: float


def rebased(row: TrainingRow, old_logprobs: list[float]) -> RebasedRow:
    """``row`` with ``old_logprobs`` in place of the recorded ones."""
    return RebasedRow(list(row.input_ids), list(row.loss_mask), old_logprobs, row.weight, row.advantage)


def own_logprobs(rows: Sequence[TrainingRow], logps: torch.Tensor) -> dict[int, list[float]]:
    """Row id -> its unpadded logprobs from a padded (rows, tokens) tensor (unsampled positions: 0.0)."""
    values = logps.detach().float().cpu()
    return {id(row): [float(v) if m else 0.0 for v, m in zip(values[i, : len(row.input_ids)].tolist(), row.loss_mask,
                                                              strict=True)]
            for i, row in enumerate(rows)}

"""The clipped policy-gradient objective on weighted, masked rows (GRPO/DAPO-style, no KL term).

Per token: ``max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))`` with ``r = exp(logp - old_logp)``, the
importance ratio against the logprob the model server recorded when it sampled the token. Per row: the mean
over its sampled tokens. Per batch: rows weighted by ``weights`` and divided by ``normalizer`` (the sum of the
batch's weights: the number of rollouts under ``rollout`` weighting, of rows under ``fragment``).
"""

from __future__ import annotations

import torch
from trl.trainer.utils import entropy_from_logits, selective_log_softmax


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
                        clip_low: float = 0.2, clip_high: float = 0.28) -> tuple[torch.Tensor, dict[str, float]]:
    """(loss, stats) for a padded batch: ``logps``/``old_logps``/``loss_mask`` are (rows, tokens); ``advantages``
    and ``weights`` are (rows,). Padding and unsampled tokens must have mask 0."""
    mask = loss_mask.float()
    ratio = torch.exp((logps - old_logps) * mask)
    adv = advantages.unsqueeze(1)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    per_row = (per_token * mask).sum(1) / mask.sum(1).clamp(min=1.0)
    loss = (per_row * weights).sum() / normalizer
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        was_clipped = ((clipped > unclipped) & (mask > 0)).float().sum() / n
        stats = {"clip_fraction": float(was_clipped),
                 "ratio_mean": float((ratio * mask).sum() / n),
                 "log_ratio_abs_max": float(((logps - old_logps).abs() * mask).max()) if mask.any() else 0.0}
    return loss, stats

"""One policy-gradient step on recorded rows on any device, and saving the result as a servable checkpoint.

What the GPU check needs to exercise the train -> save -> serve plumbing. :func:`policy_step` uses the
trainer's objective (``repro.train``: clipped ratio against the recorded sampling logprobs) when it can be
imported, else a plain REINFORCE loss ``-sum_i A_i * sum_t log p(c_it | prefix) / n_tokens``. Either way one
AdamW step (AdamW moves every weight by about ``lr`` on its first step, so the change shows through serving
precision). ``repro.train.rl.PolicyTrainer`` itself runs on CPU tensors only, hence this device-aware loop.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from repro.bench.logprob_check import Row

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def advantages(rewards: list[float | None]) -> list[float]:
    """Rewards minus their mean; when they are all equal (no signal, e.g. every rollout failed), alternating
    +1 / -1, so that the step still changes the weights (the check is about plumbing, not learning)."""
    values = [0.0 if r is None else float(r) for r in rewards]
    mean = sum(values) / len(values) if values else 0.0
    if all(abs(v - mean) < 1e-12 for v in values):
        return [1.0 if i % 2 == 0 else -1.0 for i in range(len(values))]
    return [v - mean for v in values]


def _truncate(row: Row, max_len: int) -> tuple[list[int], list[int], list[float]]:
    """(prompt, completion, logprobs) cut to ``max_len`` tokens: the completion's head, the prompt's tail."""
    completion = row.completion_ids[: max_len - 1]
    prompt = row.prompt_ids[-(max_len - len(completion)) :]
    return prompt, completion, row.logprobs[: len(completion)]


def _row_logprob_sum(model: torch.nn.Module, row: Row, device: str, max_len: int) -> tuple[torch.Tensor, int]:
    """Sum of log p over the row's completion tokens (prompt cut from the left to fit ``max_len``)."""
    prompt, completion, _ = _truncate(row, max_len)
    ids = torch.tensor([prompt + completion], device=device)
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    target = torch.tensor(completion, device=device).unsqueeze(-1)
    return torch.log_softmax(logits, dim=-1).gather(-1, target).sum(), len(completion)


def reinforce_step(model: torch.nn.Module, rows: list[Row], advs: list[float], *, lr: float, device: str,
                   max_len: int = 4096, max_grad_norm: float = 1.0) -> dict[str, Any]:
    """One optimizer step on ``rows`` weighted by ``advs``; returns loss, grad norm and token count."""
    if not rows:
        raise ValueError("no rows to train on")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    optimizer.zero_grad(set_to_none=True)
    n_tokens = sum(min(len(r.completion_ids), max_len - 1) for r in rows)
    loss_total = 0.0
    for row, adv in zip(rows, advs, strict=True):  # one backward per row keeps peak memory at one sequence
        logp_sum, _ = _row_logprob_sum(model, row, device, max_len)
        loss = -adv * logp_sum / n_tokens
        loss.backward()
        loss_total += float(loss.detach())
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm))
    optimizer.step()
    model.eval()
    return {"loss": loss_total, "grad_norm": grad_norm, "n_rows": len(rows), "n_tokens": n_tokens, "lr": lr}


@dataclass
class TrainRow:
    """A recorded call in the shape ``repro.train`` reads (its ``TrainingRow``): aligned token lists."""

    input_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    weight: float
    advantage: float


def training_rows(rows: list[Row], advs: list[float], max_len: int) -> list[TrainRow]:
    """Prompt + completion per row, loss on the completion, the server's logprobs as the sampling logprobs (rows
    with fewer logprobs than tokens are left out: the ratio needs every one)."""
    out = []
    for row, adv in zip(rows, advs, strict=True):
        prompt, completion, logprobs = _truncate(row, max_len)
        if len(logprobs) < len(completion):
            continue
        out.append(TrainRow(prompt + completion, [0] * len(prompt) + [1] * len(completion),
                            [0.0] * len(prompt) + logprobs, 1.0, adv))
    return out


def clipped_step(model: torch.nn.Module, rows: list[Row], advs: list[float], *, lr: float, device: str,
                 max_len: int = 4096, max_grad_norm: float = 1.0) -> dict[str, Any]:
    """One AdamW step on ``repro.train``'s clipped objective, one row per micro-batch, on ``device``."""
    from repro.train.policy_loss import clipped_policy_loss, token_logprobs
    from repro.train.rl import check_rows, pad_rows

    batch_rows = training_rows(rows, advs, max_len)
    if not batch_rows:
        raise ValueError("no row has a logprob for every completion token")
    check_rows(batch_rows)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    optimizer.zero_grad(set_to_none=True)
    pad_id = model.config.pad_token_id or 0
    loss_total, ratio_max = 0.0, 0.0
    for row in batch_rows:
        batch = {k: v.to(device) for k, v in pad_rows([row], pad_id).items()}
        logps = token_logprobs(model, batch["input_ids"], batch["attention_mask"])
        loss, stats = clipped_policy_loss(logps, batch["old_logps"], batch["advantages"], batch["loss_mask"],
                                          batch["weights"], float(len(batch_rows)))
        loss.backward()
        loss_total += float(loss.detach())
        ratio_max = max(ratio_max, stats["log_ratio_abs_max"])
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm))
    optimizer.step()
    model.eval()
    return {"loss": loss_total, "grad_norm": grad_norm, "n_rows": len(batch_rows), "lr": lr,
            "n_tokens": sum(sum(r.loss_mask) for r in batch_rows), "log_ratio_abs_max": ratio_max,
            "trainer": "repro.train clipped_policy_loss"}


def policy_step(model: torch.nn.Module, rows: list[Row], advs: list[float], *, lr: float, device: str,
                max_len: int = 4096) -> dict[str, Any]:
    """:func:`clipped_step` when ``repro.train`` imports (it needs ``trl``), else :func:`reinforce_step`."""
    try:
        import repro.train.policy_loss  # noqa: F401
    except ImportError as exc:
        stats = reinforce_step(model, rows, advs, lr=lr, device=device, max_len=max_len)
        return {**stats, "trainer": "REINFORCE (repro.bench.policy_step)", "trainer_fallback_reason": str(exc)}
    return clipped_step(model, rows, advs, lr=lr, device=device, max_len=max_len)


def save_checkpoint(model: Any, base_dir: Path, out_dir: Path) -> Path:
    """Save ``model`` to ``out_dir`` with every non-weight file of ``base_dir`` (tokenizer, manifest, ...)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in Path(base_dir).iterdir():
        if path.is_file() and not path.name.endswith(_WEIGHT_SUFFIXES) and not path.name.endswith(".index.json"):
            shutil.copy2(path, out_dir / path.name)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir

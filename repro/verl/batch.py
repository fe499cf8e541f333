"""repro's training rows as verl's batch: the fields verl's actor reads, laid out as verl's own rollout lays them out.

A row of :mod:`repro.train.samples` is a token sequence with a loss mask (1 on tokens the model sampled), the sampling
logprobs, an advantage and a weight. verl's batch splits each sequence into a prompt, left-padded to one width, and
a response, right-padded to another: the prompt is the row up to its first sampled token, the response everything
after (in a prefix-merged row the later prompts' new tokens, the harness's observations, sit inside the response
with mask 0, as in verl's own multi-turn rollouts). Fields (``B`` rows, prompt width ``P``, response width ``R``):

* ``prompts`` (B, P), ``responses`` (B, R), ``input_ids`` (B, P + R), ``attention_mask`` (B, P + R),
  ``position_ids`` (B, P + R): 0 on left padding, then 0, 1, 2... over the row's tokens;
* ``response_mask`` (B, R): the row's loss mask over its response; ``rollout_log_probs`` (B, R): the logprobs the
  server sampled with (0 where not sampled);
* ``token_level_scores`` / ``token_level_rewards`` (B, R): the rollout's reward on the row's last sampled token;
  ``advantages`` / ``returns`` (B, R): the row's advantage on its sampled tokens;
* non-tensor ``uid`` (the GRPO group), ``rollout_id``, ``row_index``, ``weight`` (the row's share of its rollout).

Imports only torch and numpy (and verl in :func:`to_dataproto`), so it loads in verl's environment, where the rest
of the package's dependencies are not installed; rows cross between the environments as JSON
(:func:`rows_to_json` / :func:`rows_from_json`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch


class RowLike(Protocol):
    """What the conversion reads of a row (``repro.train.samples.build.Row`` has these)."""

    rollout_id: str
    group_id: str
    row_index: int
    input_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    weight: float
    advantage: float
    reward: float | None


@dataclass
class PlainRow:
    """A row as it crosses to verl's environment and is read back there (JSON of these fields)."""

    rollout_id: str
    group_id: str
    row_index: int
    input_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    weight: float
    advantage: float
    reward: float | None


ROW_FIELDS = tuple(f.name for f in fields(PlainRow))  # what crosses to verl's environment


def rows_to_json(rows: Sequence[RowLike], path: Path) -> Path:
    """Write the rows' fields as a JSON list (what crosses from the package's environment to verl's)."""
    path.write_text(json.dumps([{name: getattr(r, name) for name in ROW_FIELDS} for r in rows]))
    return path


def rows_from_json(path: Path) -> list[PlainRow]:
    return [PlainRow(**item) for item in json.loads(path.read_text())]


def split_row(row: RowLike) -> tuple[list[int], list[int], list[int], list[float]]:
    """(prompt ids, response ids, response mask, response logprobs): the prompt ends before the first sampled
    token; a row with no sampled token cannot train and is refused."""
    if not len(row.input_ids) == len(row.loss_mask) == len(row.old_logprobs):
        raise ValueError(f"row {row.rollout_id}#{row.row_index}: input_ids, loss_mask and old_logprobs differ in "
                         "length")
    if 1 not in row.loss_mask:
        raise ValueError(f"row {row.rollout_id}#{row.row_index} has no sampled token to train on")
    first = row.loss_mask.index(1)
    if first == 0:
        raise ValueError(f"row {row.rollout_id}#{row.row_index} starts with a sampled token: it has no prompt")
    return (list(row.input_ids[:first]), list(row.input_ids[first:]), list(row.loss_mask[first:]),
            [float(x) for x in row.old_logprobs[first:]])


def _left(values: list, width: int, fill: float, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor([fill] * (width - len(values)) + list(values), dtype=dtype)


def _right(values: list, width: int, fill: float, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(list(values) + [fill] * (width - len(values)), dtype=dtype)


def batch_tensors(rows: Sequence[RowLike], pad_id: int, prompt_width: int = 0,
                  response_width: int = 0) -> dict[str, torch.Tensor]:
    """The tensor fields of the module docstring; widths default to the longest prompt / response."""
    parts = [split_row(r) for r in rows]
    width_p = max(prompt_width, *(len(p) for p, _, _, _ in parts))
    width_r = max(response_width, *(len(s) for _, s, _, _ in parts))
    out: dict[str, list[torch.Tensor]] = {k: [] for k in ("prompts", "responses", "prompt_mask", "response_mask",
                                                         "response_attention", "rollout_log_probs", "scores",
                                                         "advantages")}
    for row, (prompt, response, mask, logps) in zip(rows, parts, strict=True):
        out["prompts"].append(_left(prompt, width_p, pad_id, torch.long))
        out["prompt_mask"].append(_left([1] * len(prompt), width_p, 0, torch.long))
        out["responses"].append(_right(response, width_r, pad_id, torch.long))
        out["response_attention"].append(_right([1] * len(response), width_r, 0, torch.long))
        out["response_mask"].append(_right(mask, width_r, 0, torch.long))
        out["rollout_log_probs"].append(_right([lp if m else 0.0 for lp, m in zip(logps, mask, strict=True)],
                                               width_r, 0.0, torch.float32))
        last = max(i for i, m in enumerate(mask) if m)
        scores = [0.0] * width_r
        scores[last] = float(row.reward or 0.0)
        out["scores"].append(torch.tensor(scores, dtype=torch.float32))
        out["advantages"].append(_right([float(row.advantage) * m for m in mask], width_r, 0.0, torch.float32))
    stacked = {k: torch.stack(v) for k, v in out.items()}
    attention = torch.cat([stacked.pop("prompt_mask"), stacked.pop("response_attention")], dim=1)
    scores, advantages = stacked.pop("scores"), stacked.pop("advantages")
    return {**stacked, "input_ids": torch.cat([stacked["prompts"], stacked["responses"]], dim=1),
            "attention_mask": attention, "position_ids": (attention.cumsum(dim=1) - 1).clamp(min=0) * attention,
            "token_level_scores": scores, "token_level_rewards": scores.clone(), "advantages": advantages,
            "returns": advantages.clone()}


def non_tensor_fields(rows: Sequence[RowLike]) -> dict[str, np.ndarray]:
    """``uid`` (the GRPO group), ``rollout_id``, ``row_index`` and ``weight`` per row, as verl's object arrays."""
    return {"uid": np.array([r.group_id for r in rows], dtype=object),
            "rollout_id": np.array([r.rollout_id for r in rows], dtype=object),
            "row_index": np.array([r.row_index for r in rows], dtype=object),
            "weight": np.array([float(r.weight) for r in rows], dtype=object)}


def to_dataproto(rows: Sequence[RowLike], pad_id: int, meta: dict[str, Any] | None = None) -> Any:
    """The rows as a ``verl.DataProto`` (verl's environment only)."""
    from verl import DataProto

    return DataProto.from_dict(tensors=batch_tensors(rows, pad_id), non_tensors=non_tensor_fields(rows),
                               meta_info=dict(meta or {}))


def response_values(values: torch.Tensor, rows: Sequence[RowLike]) -> list[list[float]]:
    """Per row, the values of a (B, R) response tensor over the row's own response tokens (padding dropped)."""
    return [values[i, :len(split_row(r)[1])].tolist() for i, r in enumerate(rows)]

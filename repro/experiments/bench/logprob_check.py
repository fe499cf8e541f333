"""Does the server's record agree with the checkpoint? Teacher-forced logprobs under transformers vs recorded ones.

For each recorded call (prompt ids P, completion ids C, sampled-token logprobs L), one forward pass of the
checkpoint over P + C gives log p(C_t | P, C_<t); the check reports max / mean |diff| against L and, for
calls decoded greedily (temperature 0), whether each C_t was the argmax (a mismatch within ``tie_gap`` of
the top logprob is a near-tie, which a different kernel or dtype may break the other way).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from repro.serving.weight_probe import Tolerance

USABLE_STATUSES = ("ok", "truncated")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Row:
    """One recorded model call: what the server was shown, what it sampled, and the logprobs it reported."""

    rollout_id: str
    seq: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    temperature: float | None = None
    reward: float | None = None


def _temperature(call: Any) -> float | None:
    value = (call.sampling_overrides or {}).get("temperature", (call.request or {}).get("temperature"))
    return None if value is None else float(value)


def rows_from_store(store_path: Path, limit: int | None = None) -> list[Row]:
    """The usable calls of every rollout in a trace store: answered (``ok``, or ``truncated`` at max_tokens) with
    token ids and logprobs."""
    from repro.store import open_store

    store = open_store(store_path)
    rows: list[Row] = []
    try:
        for rollout in store.list_rollouts():
            for call in store.calls(rollout.rollout_id):
                if call.status in USABLE_STATUSES and call.prompt_ids and call.completion_ids and call.logprobs:
                    rows.append(Row(rollout.rollout_id, call.seq, call.prompt_ids, call.completion_ids,
                                    call.logprobs, _temperature(call), rollout.reward))
    finally:
        store.close()
    return rows[:limit] if limit is not None else rows


def load_causal_lm(model_dir: Path, dtype: str, device: str) -> torch.nn.Module:
    """The checkpoint as a transformers causal LM in ``dtype`` on ``device``, in eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=DTYPES[dtype])
    return model.to(device).eval()


@torch.no_grad()
def teacher_forced(model: torch.nn.Module, prompt_ids: list[int], completion_ids: list[int],
                   device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p of each completion token, log p of the argmax token at each position), float32 on CPU."""
    ids = torch.tensor([prompt_ids + completion_ids], device=device)
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : len(prompt_ids) + len(completion_ids) - 1]
    logp = torch.log_softmax(logits.float(), dim=-1)
    target = torch.tensor(completion_ids, device=device).unsqueeze(-1)
    return logp.gather(-1, target).squeeze(-1).cpu(), logp.max(dim=-1).values.cpu()


@dataclass
class RowCheck:
    """One row's agreement with the checkpoint."""

    rollout_id: str
    seq: int
    n_tokens: int
    max_abs_diff: float
    sum_abs_diff: float
    greedy: bool
    argmax_mismatches: int  # greedy rows: tokens that were not the argmax by more than the tie margin
    near_tie_mismatches: int
    length_mismatch: bool  # the server reported a different number of logprobs than token ids


def check_row(model: torch.nn.Module, row: Row, device: str, tol: Tolerance) -> RowCheck:
    """Compare one row's recorded logprobs (and greedy choices) with a teacher-forced forward pass."""
    ours, best = teacher_forced(model, row.prompt_ids, row.completion_ids, device)
    n = min(len(row.logprobs), len(ours))
    diff = (ours[:n] - torch.tensor(row.logprobs[:n], dtype=torch.float32)).abs()
    greedy = row.temperature == 0.0
    gap = best - ours  # 0 where the recorded token is the argmax
    off = gap > 0
    beyond = int((gap > tol.tie_gap).sum()) if greedy else 0
    return RowCheck(row.rollout_id, row.seq, n, float(diff.max()) if n else 0.0, float(diff.sum()), greedy,
                    beyond, int(off.sum()) - beyond if greedy else 0, len(row.logprobs) != len(row.completion_ids))


def summarize(checks: list[RowCheck], tol: Tolerance) -> dict[str, Any]:
    """Totals over rows and the verdict: within tolerance, no greedy mismatch beyond a near-tie."""
    n_tokens = sum(c.n_tokens for c in checks)
    worst = max(checks, key=lambda c: c.max_abs_diff, default=None)
    max_abs = worst.max_abs_diff if worst else 0.0
    mean_abs = sum(c.sum_abs_diff for c in checks) / n_tokens if n_tokens else 0.0
    mismatches = sum(c.argmax_mismatches for c in checks)
    return {
        "n_rows": len(checks), "n_tokens": n_tokens, "max_abs_diff": max_abs, "mean_abs_diff": mean_abs,
        "greedy_rows": sum(c.greedy for c in checks), "argmax_mismatches": mismatches,
        "near_tie_mismatches": sum(c.near_tie_mismatches for c in checks),
        "length_mismatches": sum(c.length_mismatch for c in checks),
        "worst": {"rollout_id": worst.rollout_id, "seq": worst.seq} if worst else None,
        "tolerance": asdict(tol),
        "passed": bool(checks) and max_abs <= tol.max_abs and mean_abs <= tol.mean_abs and mismatches == 0
        and not any(c.length_mismatch for c in checks),
    }


def compare_rows(model: torch.nn.Module, rows: list[Row], device: str, tol: Tolerance) -> dict[str, Any]:
    """:func:`summarize` of :func:`check_row` over ``rows``."""
    return summarize([check_row(model, row, device, tol) for row in rows], tol)


@torch.no_grad()
def greedy_rows(model: torch.nn.Module, tokenizer: Any, prompts: list[str], max_new_tokens: int,
                  device: str) -> list[Row]:
    """Greedy rows from transformers' own ``generate`` (KV-cached decoding), logprobs of the raw logits."""
    rows = []
    for i, text in enumerate(prompts):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               tokenize=True, return_dict=False)
        out = model.generate(torch.tensor([list(prompt)], device=device), do_sample=False,
                             max_new_tokens=max_new_tokens, output_logits=True, return_dict_in_generate=True)
        completion = out.sequences[0, len(prompt) :].tolist()
        logps = [torch.log_softmax(step[0].float(), -1)[tok].item() for step, tok in zip(out.logits, completion,
                                                                                          strict=False)]
        rows.append(Row(f"generate-{i}", 0, list(prompt), completion, logps, 0.0, None))
    return rows

"""Did the reload take? A fixed probe, sampled greedily from the server before and after a weight sync, scored by
the trainer that made the new weights.

After a sync the server's greedy completion of the probe prompt must carry the logprobs the trainer's own copy of
the new weights gives the same tokens (within the served dtype's tolerance). Stale weights fail this whenever the
update moved the probe by more than the tolerance; how far it moved (the trainer's new logprobs of the tokens the
server sampled *before* the sync, against the logprobs the server gave them then) is reported as ``moved``, and
``distinguishable`` says whether the check could have told old weights from new ones. Served dtype tolerances are
defined here (:data:`TOLERANCES`) and shared with the logprob parity checks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

PROBE_TEXT = "def add(a, b):\n    return a - b\n\n# The tests fail: add(2, 3) returns -1. Fix:"
PROBE_TOKENS = 8


@dataclass(frozen=True)
class Tolerance:
    """Largest accepted |logprob diff| (per token and on average) and the near-tie margin for greedy ids."""

    max_abs: float
    mean_abs: float
    tie_gap: float


# The one home of the served dtypes' logprob tolerances (the reload probe, the parity checks). Serving kernels differ
# from transformers' (fused attention, other reduction orders), so exact equality is not expected; bf16 carries ~3
# significant digits.
TOLERANCES = {
    "float32": Tolerance(max_abs=2e-3, mean_abs=2e-4, tie_gap=1e-3),
    "bfloat16": Tolerance(max_abs=0.1, mean_abs=0.02, tie_gap=0.05),
    "float16": Tolerance(max_abs=0.05, mean_abs=0.01, tie_gap=0.02),
}
# the reload probe: the largest |served - trainer| logprob difference per token that still counts as the same weights
TOLERANCE = {dtype: tol.max_abs for dtype, tol in TOLERANCES.items()}

Scorer = Callable[[Sequence[int], Sequence[int]], list[float]]  # (prompt ids, completion ids) -> logprobs


class StaleWeightsError(RuntimeError):
    """After a sync the server's logprobs are not those of the new weights."""


@dataclass
class Sampled:
    """The server's greedy completion of the probe: token ids and their logprobs."""

    ids: list[int]
    logprobs: list[float]


@dataclass
class ReloadCheck:
    """The probe after one sync (see the module doc)."""

    tokens: int
    max_abs_diff: float  # served after the sync vs the trainer's new weights, same tokens
    moved: float | None  # how far the update moved the probe's pre-sync tokens (None: nothing sampled before)
    tolerance: float
    distinguishable: bool  # moved > 2 x tolerance: stale weights would have failed the check
    passed: bool


def probe_prompt_ids(model_dir: Path) -> list[int]:
    """The probe prompt in the checkpoint's tokenizer."""
    from transformers import AutoTokenizer

    return list(AutoTokenizer.from_pretrained(str(model_dir))(PROBE_TEXT)["input_ids"])


def sample(server_url: str, model_name: str, prompt_ids: Sequence[int], max_tokens: int = PROBE_TOKENS) -> Sampled:
    """A greedy ``/v1/completions`` of ``prompt_ids`` straight from the model server (not the proxy: nothing
    recorded)."""
    resp = httpx.post(f"{server_url}/v1/completions", timeout=300, json={
        "model": model_name, "prompt": list(prompt_ids), "max_tokens": max_tokens, "temperature": 0.0,
        "logprobs": 1, "return_token_ids": True, "ignore_eos": True})
    if resp.status_code != 200:
        raise StaleWeightsError(f"the weight probe's request failed ({resp.status_code}): {resp.text[:300]}")
    choice = resp.json()["choices"][0]
    ids = choice.get("token_ids") or []
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
    if not ids or len(ids) != len(logprobs):
        raise StaleWeightsError(f"the weight probe got {len(ids)} token ids and {len(logprobs)} logprobs: the server "
                                "must return both (return_token_ids, logprobs)")
    return Sampled(list(ids), [float(x) for x in logprobs])


def _max_diff(a: Sequence[float], b: Sequence[float]) -> float:
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


def check_reload(prompt_ids: Sequence[int], before: Sampled | None, after: Sampled, scorer: Scorer,
                 tolerance: float) -> ReloadCheck:
    """Compare the post-sync sample with the trainer's scores (see the module doc)."""
    diff = _max_diff(after.logprobs, scorer(prompt_ids, after.ids))
    moved = _max_diff(before.logprobs, scorer(prompt_ids, before.ids)) if before is not None else None
    distinguishable = moved is not None and moved > 2 * tolerance
    return ReloadCheck(len(after.ids), round(diff, 8), None if moved is None else round(moved, 8), tolerance,
                       distinguishable, diff <= tolerance)


def require_fresh(check: ReloadCheck, where: str) -> None:
    """Raise :class:`StaleWeightsError` when the check failed."""
    if not check.passed:
        stale = " (as far as the update moved it: the old weights are still served)" \
            if check.moved is not None and abs(check.max_abs_diff - check.moved) <= check.tolerance else ""
        raise StaleWeightsError(
            f"after the weight sync into {where} the served logprobs of the probe differ from the trainer's new "
            f"weights by {check.max_abs_diff:.3g} (tolerance {check.tolerance:g}; the update moved the probe "
            f"{check.moved if check.moved is not None else 'n/a'}){stale}")

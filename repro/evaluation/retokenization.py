"""Retokenization drift counted from recorded calls: what a loop that re-renders messages does to sampled ids.

From the calls the recording proxy stored (token ids of every prompt and sampled completion), per harness:

- **prefix drift** (:func:`prefix_drift`): of the turns that have a previous call of the same purpose in their
  rollout, how many prompts are *not* that call's prompt + sampled completion followed by more tokens (what a
  prefix merge has to handle), with the cause of each break: ``retokenized`` (the history is kept and the reply is
  back as the canonical ids of its text), ``reply_rewritten`` (the history is kept but the reply comes back as
  other ids: re-serialized tool calls, dropped specials, a think block), ``history_changed`` (the previous prompt
  itself is not a prefix: a dropped reply, re-rendered or truncated history). Counted from the ids, not from the
  store's ``extends_previous`` flag (disagreements with the flag are counted too);
- **non-canonical completions** (:func:`retokenization`): sampled completions (without a final end-of-turn
  token) whose decoded text encodes to different ids, and how many of those are not even valid UTF-8;
- **prompt lengths** (:func:`prompt_lengths`), including prompts the server refused for the model's context.

Every share is a :class:`Share`: k of n with a 95% Wilson interval.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from repro.evaluation.metrics import wilson_interval

BREAK_CAUSES = ("retokenized", "reply_rewritten", "history_changed")
_REFUSED_LENGTH = re.compile(r"request has (\d+) input tokens|\((\d+) in the messages")


@dataclass(frozen=True)
class Share:
    """``k`` of ``n`` with its 95% Wilson interval (``rate`` None when n is 0)."""

    k: int
    n: int

    @property
    def rate(self) -> float | None:
        return self.k / self.n if self.n else None

    def to_dict(self) -> dict[str, Any]:
        low, high = wilson_interval(self.k, self.n) if self.n else (None, None)
        return {"k": self.k, "n": self.n, "rate": self.rate, "ci_low": low, "ci_high": high}


def starts_with(ids: Sequence[int], prefix: Sequence[int]) -> bool:
    return len(ids) >= len(prefix) and list(ids[:len(prefix)]) == list(prefix)


def without_eos(ids: Sequence[int], eos_ids: Iterable[int]) -> list[int]:
    """``ids`` without a final end-of-turn token (the stop token is not part of the reply's text)."""
    ids = list(ids)
    return ids[:-1] if ids and ids[-1] in set(eos_ids) else ids


def canonical_ids(tokenizer: Any, ids: Sequence[int], eos_ids: Iterable[int]) -> list[int]:
    """The ids the tokenizer gives the text of ``ids`` (a final end-of-turn token kept as it was)."""
    body = without_eos(ids, eos_ids)
    text = tokenizer.decode(body, skip_special_tokens=False)
    return [*tokenizer.encode(text, add_special_tokens=False), *list(ids[len(body):])]


def break_cause(prev_prompt: Sequence[int], prev_completion: Sequence[int], prompt: Sequence[int],
                canonical: Sequence[int]) -> str | None:
    """None when ``prompt`` extends ``prev_prompt + prev_completion``, else the cause (see the module docstring).
    ``canonical``: the re-encoded completion (:func:`canonical_ids`)."""
    if starts_with(prompt, [*prev_prompt, *prev_completion]):
        return None
    if not starts_with(prompt, prev_prompt):
        return "history_changed"
    return "retokenized" if starts_with(prompt[len(prev_prompt):], canonical) else "reply_rewritten"


def _has_ids(call: Any) -> bool:
    return call.prompt_ids is not None and call.completion_ids is not None


def prefix_drift(rollouts: Iterable[Sequence[Any]], tokenizer: Any, eos_ids: Iterable[int]) -> dict[str, Any]:
    """Prefix drift per purpose over ``rollouts`` (each: its calls in ``seq`` order); see the module docstring.
    A turn is comparable when it and the previous call of its purpose both have prompt and completion ids."""
    eos_ids = list(eos_ids)
    per: dict[str, dict[str, Any]] = {}
    for calls in rollouts:
        previous: dict[str, Any] = {}
        for call in calls:
            stats = per.setdefault(call.purpose, {"turns": 0, "breaks": 0, "not_comparable": 0,
                                                  "flag_disagrees": 0, **{c: 0 for c in BREAK_CAUSES}})
            before = previous.get(call.purpose)
            if _has_ids(call):
                previous[call.purpose] = call
            if before is None:
                continue
            if not (_has_ids(call) and _has_ids(before)):
                stats["not_comparable"] += 1
                continue
            cause = break_cause(before.prompt_ids, before.completion_ids, call.prompt_ids,
                                canonical_ids(tokenizer, before.completion_ids, eos_ids))
            stats["turns"] += 1
            if cause is not None:
                stats["breaks"] += 1
                stats[cause] += 1
            if call.extends_previous is not None and call.extends_previous != (cause is None):
                stats["flag_disagrees"] += 1
    return {purpose: stats | {"share": Share(stats["breaks"], stats["turns"]).to_dict()}
            for purpose, stats in sorted(per.items())}


def total_share(per_purpose: dict[str, Any], key: str = "breaks", of: str = "turns") -> dict[str, Any]:
    """One share over every purpose of a :func:`prefix_drift` / :func:`retokenization` result."""
    return Share(sum(s[key] for s in per_purpose.values()), sum(s[of] for s in per_purpose.values())).to_dict()


def token_bytes(tokenizer: Any, ids: Sequence[int]) -> bytes:
    """The bytes a byte-level BPE tokenizer's ``ids`` stand for (added tokens: their text in UTF-8)."""
    from repro.tinymodel.qwen3_tokenizer import byte_values

    inverse = byte_values()
    added = set(getattr(tokenizer, "all_special_ids", []) or []) | set(
        getattr(tokenizer, "added_tokens_decoder", {}) or {})
    out = bytearray()
    for token_id, token in zip(ids, tokenizer.convert_ids_to_tokens(list(ids)), strict=True):
        if token_id in added or any(ch not in inverse for ch in token):
            out += token.encode()
        else:
            out += bytes(inverse[ch] for ch in token)
    return bytes(out)


def is_utf8(data: bytes) -> bool:
    """Whether ``data`` decodes as UTF-8 on its own."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def retokenization(calls: Iterable[Any], tokenizer: Any, eos_ids: Iterable[int]) -> dict[str, Any]:
    """Per purpose: sampled completions (non-empty once a final end-of-turn token is dropped) whose decoded text
    re-encodes to other ids (``non_canonical``), of which ``invalid_utf8``; and the sampled tokens."""
    eos_ids = list(eos_ids)
    per: dict[str, dict[str, Any]] = {}
    for call in calls:
        body = without_eos(call.completion_ids or [], eos_ids)
        if not body:
            continue
        stats = per.setdefault(call.purpose, {"completions": 0, "non_canonical": 0, "invalid_utf8": 0,
                                              "tokens": 0, "canonical_tokens": 0})
        canonical = canonical_ids(tokenizer, body, eos_ids)
        stats["completions"] += 1
        stats["tokens"] += len(body)
        stats["canonical_tokens"] += len(canonical)
        if canonical != body:
            stats["non_canonical"] += 1
            stats["invalid_utf8"] += not is_utf8(token_bytes(tokenizer, body))
    return {purpose: stats | {"share": Share(stats["non_canonical"], stats["completions"]).to_dict()}
            for purpose, stats in sorted(per.items())}


def refused_prompt_tokens(error: str | None) -> int | None:
    """The prompt length a server's context-length refusal names (vLLM's wording), else None."""
    match = _REFUSED_LENGTH.search(error or "")
    return int(match.group(1) or match.group(2)) if match else None


def prompt_lengths(rollouts: Iterable[Sequence[Any]], max_model_len: int | None) -> dict[str, Any]:
    """Prompt tokens: of each rollout's first policy call, the largest of any call, and the calls refused as too
    long for the context (with the largest length refused)."""
    first: list[int] = []
    known: list[int] = []
    refused: list[int] = []
    for calls in rollouts:
        sizes = [_prompt_size(c) for c in calls]
        refused += [n for n in map(refused_prompt_tokens, (c.error for c in calls)) if n is not None]
        known += [n for n in sizes if n]
        policy = [n for c, n in zip(calls, sizes, strict=True) if c.purpose == "policy" and n]
        if policy:
            first.append(policy[0])
    return {"max_model_len": max_model_len, "first_prompt_median": statistics.median(first) if first else None,
            "max_prompt": max(known, default=None), "refused_calls": len(refused),
            "refused_max": max(refused, default=None)}


def _prompt_size(call: Any) -> int | None:
    """The call's prompt tokens: its ids, the server's count, or the length a context refusal names."""
    if call.prompt_ids is not None:
        return len(call.prompt_ids)
    return call.prompt_tokens or refused_prompt_tokens(call.error)

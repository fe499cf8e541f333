"""One rollout's ordered calls -> fragments: token rows with a loss mask and the sampler's logprobs.

A fragment's ``input_ids`` are the last call it holds' prompt + completion. ``loss_mask`` is 1 exactly on
tokens the model sampled (the completions of the calls it holds) and 0 on everything else (system prompt,
tool outputs, template text). ``old_logprobs`` are aligned to ``input_ids``: 0.0 where the mask is 0, the
call's logprob of each sampled token where it is 1, and NaN where the call recorded no (or misaligned)
logprobs; such fragments list the call in ``missing_logprob_seqs`` so a trainer can refuse them.

Calls are trained on only when their purpose is in ``train_purposes`` (default: the agent's own ``policy``
calls and condenser ``summary`` calls; a harness's ``auxiliary`` side calls such as OpenCode's title request
are skipped). In ``prefix_merge`` a call only extends a fragment of its own purpose, so side calls that arrive
between the agent's calls do not break its chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from repro.store import CallRecord

MODES = ("per_call", "prefix_merge")
DEFAULT_TRAIN_PURPOSES = ("policy", "summary")
TRAINABLE_STATUSES = ("ok", "truncated")  # truncated = finish_reason "length": the tokens were still sampled
NAN = float("nan")


@dataclass
class SkippedCall:
    """A call that gave no tokens to train on, and why."""

    seq: int
    reason: str


@dataclass
class Fragment:
    """A token row built from one call or a chain of calls whose prompts extend each other."""

    call_seqs: list[int] = field(default_factory=list)
    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    old_logprobs: list[float] = field(default_factory=list)
    missing_logprob_seqs: list[int] = field(default_factory=list)

    @property
    def n_sampled(self) -> int:
        return sum(self.loss_mask)

    def add(self, call: CallRecord, new_prompt: Sequence[int]) -> None:
        """Append the not-yet-held part of ``call``'s prompt (mask 0) and its completion (mask 1)."""
        completion = call.completion_ids or []
        logprobs = call.logprobs
        if logprobs is None or len(logprobs) != len(completion):
            logprobs = [NAN] * len(completion)
            self.missing_logprob_seqs.append(call.seq)
        self.call_seqs.append(call.seq)
        self.input_ids.extend(new_prompt)
        self.input_ids.extend(completion)
        self.loss_mask.extend([0] * len(new_prompt) + [1] * len(completion))
        self.old_logprobs.extend([0.0] * len(new_prompt) + list(logprobs))


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"samples mode must be one of {', '.join(MODES)}; got {mode!r}")
    return mode


def skip_reason(call: CallRecord, train_purposes: Sequence[str] = DEFAULT_TRAIN_PURPOSES) -> str | None:
    """Why ``call`` cannot be trained on (None when it can)."""
    if call.purpose not in train_purposes:
        return f"purpose {call.purpose} (not in samples.train_purposes)"
    if call.status not in TRAINABLE_STATUSES:
        return f"status {call.status}"
    if not call.prompt_ids:
        return "no prompt token ids"
    if not call.completion_ids:
        return "no completion token ids"
    return None


def extends(fragment: Fragment, prompt: Sequence[int]) -> bool:
    """True when ``prompt`` starts with the fragment's whole ``input_ids``, token for token."""
    n = len(fragment.input_ids)
    return len(prompt) >= n and list(prompt[:n]) == fragment.input_ids


def usable_calls(calls: Sequence[CallRecord], train_purposes: Sequence[str] = DEFAULT_TRAIN_PURPOSES,
                 ) -> tuple[list[CallRecord], list[SkippedCall]]:
    """The calls to train on in seq order, and the skipped ones with their reasons."""
    kept: list[CallRecord] = []
    skipped: list[SkippedCall] = []
    for call in sorted(calls, key=lambda c: c.seq):
        reason = skip_reason(call, train_purposes)
        if reason is None:
            kept.append(call)
        else:
            skipped.append(SkippedCall(call.seq, reason))
    return kept, skipped


def fragments(calls: Sequence[CallRecord], mode: str = "prefix_merge",
              train_purposes: Sequence[str] = DEFAULT_TRAIN_PURPOSES) -> tuple[list[Fragment], list[SkippedCall]]:
    """Split a rollout's calls into fragments (``per_call``: one per call; ``prefix_merge``: chains of calls
    whose prompt starts with the latest fragment of the same purpose; a prompt that does not starts a new one)."""
    check_mode(mode)
    kept, skipped = usable_calls(calls, train_purposes)
    out: list[Fragment] = []
    latest: dict[str, Fragment] = {}
    for call in kept:
        prompt = call.prompt_ids or []
        current = latest.get(call.purpose)
        if mode == "prefix_merge" and current is not None and extends(current, prompt):
            current.add(call, prompt[len(current.input_ids):])
            continue
        fragment = Fragment()
        fragment.add(call, prompt)
        out.append(fragment)
        latest[call.purpose] = fragment
    return out, skipped

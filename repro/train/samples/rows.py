"""Stored calls -> training rows, step by step: fragments, row weights and GRPO advantages, and their settings.

**Fragments.** A rollout's ordered calls -> token rows with a loss mask and the sampler's logprobs. A fragment's
``input_ids`` are the last call it holds' prompt + completion. ``loss_mask`` is 1 exactly on tokens the model
sampled (the completions of the calls it holds) and 0 on everything else (system prompt, tool outputs, template
text). ``old_logprobs`` are aligned to ``input_ids``: 0.0 where the mask is 0, the call's logprob of each sampled
token where it is 1, and NaN where the call recorded no (or misaligned) logprobs; such fragments list the call in
``missing_logprob_seqs`` so a trainer can refuse them. Calls are trained on only when their purpose is in
``train_purposes`` (default: the agent's own ``policy`` calls and condenser ``summary`` calls; a harness's
``auxiliary`` side calls such as OpenCode's title request are skipped). In ``prefix_merge`` a call only extends a
fragment of its own purpose, so side calls that arrive between the agent's calls do not break its chain.

**Row weights**: how much each row of a rollout counts in the loss. ``rollout``: the rows of one rollout share one
rollout's weight, split by sampled tokens, so the weights of a rollout sum to 1 and (with a per-row token-mean
loss) the rollout contributes its per-token mean loss. ``fragment``: every row weighs 1.0, i.e. each fragment
counts as its own episode (a rollout broken into 10 fragments then counts 10 times as much as an unbroken one).

**Advantages** (GRPO): group-relative, over the rollouts of one group, and which rollouts are masked. A rollout is
masked when it has no reward to learn from: it failed for infrastructure reasons (status ``failed``), has not
finished, or has no (finite) reward; or when its mode (train/eval/demo) is not among ``include_modes`` (None:
every mode). Masked rollouts are left out of their group's statistics and get advantage 0.0; they are never scored
as reward 0, unless ``failed_reward`` is set (Agent Lightning's ``reward_fillna_value``: a failed rollout then
trains with that reward). With ``scale="group"`` the advantage is ``(r - mean) / (std + eps)`` with the
*population* std by default (``std_ddof=0``; verl's and trl's GRPO use torch's sample std, ``std_ddof=1``, which is
larger by sqrt(n / (n - 1)) for a group of n); with ``"none"`` it is ``r - mean``. A group with fewer than two
valid rollouts, or whose valid rewards are all equal, gives advantage 0.0 to all of them.

**Caps**: ``max_prompt_tokens`` drops a row whose prompt (its tokens before the first sampled one) is longer;
``max_response_tokens`` cuts a row that many tokens after its first sampled one (0: no cap).

The CLI's parser reads this module's constants and :class:`SampleConfig`'s defaults, so it imports the store
(whose package imports numpy) only for type checking and when a :class:`SampleConfig` is built.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from repro.store import CallRecord, RolloutRecord

MODES = ("per_call", "prefix_merge")
WEIGHTINGS = ("rollout", "fragment")
SCALES = ("group", "none")
CONTEXT_RULES = ("zero_reward", "mask")  # a rollout that ended on a call refused as too long (see SampleConfig)
DEFAULT_TRAIN_PURPOSES = ("policy", "summary")
TRAINABLE_STATUSES = ("ok", "truncated")  # truncated = finish_reason "length": the tokens were still sampled
NAN = float("nan")


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"samples mode must be one of {', '.join(MODES)}; got {mode!r}")
    return mode


def check_weighting(weighting: str) -> str:
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {', '.join(WEIGHTINGS)}; got {weighting!r}")
    return weighting


def check_scale(scale: str) -> str:
    if scale not in SCALES:
        raise ValueError(f"scale_rewards must be one of {', '.join(SCALES)}; got {scale!r}")
    return scale


@dataclass(frozen=True)
class SampleConfig:
    """How rollouts become rows: fragments (``mode``, ``train_purposes``), row weights (``weighting``) and
    advantages (``scale_rewards``, ``eps``, ``include_modes``)."""

    mode: str = "prefix_merge"  # "per_call" | "prefix_merge"
    weighting: str = "rollout"  # "rollout" | "fragment"
    scale_rewards: str = "group"  # "group": (r - mean) / (std + eps) | "none": r - mean
    eps: float = 1e-4
    include_modes: tuple[str, ...] | None = None  # rollout modes to train on (None: all); others are masked
    train_purposes: tuple[str, ...] = DEFAULT_TRAIN_PURPOSES  # call purposes to train on (auxiliary: skipped)
    std_ddof: int = 0  # the group std's delta degrees of freedom: 0 population std | 1 sample std (verl, trl)
    failed_reward: float | None = None  # None: failed rollouts are masked | a number: they train with that reward
    max_prompt_tokens: int = 0  # > 0: a row whose prompt (tokens before its first sampled one) is longer is dropped
    max_response_tokens: int = 0  # > 0: a row keeps at most this many tokens from its first sampled one on
    # A rollout whose last policy call was refused as longer than the model's context: "zero_reward" trains its
    # earlier calls with its graded reward (0 unless resolved), as Agent Lightning's over-long rollouts complete
    # with no reward; "mask" leaves it out of the loss and its group's statistics (DAPO's overlong filtering).
    context_exceeded: str = "zero_reward"

    def __post_init__(self) -> None:
        from repro.store.trace_records import CALL_PURPOSES  # here, not at the top: see the module's docstring

        check_mode(self.mode)
        check_weighting(self.weighting)
        check_scale(self.scale_rewards)
        if not self.eps > 0:
            raise ValueError(f"eps must be > 0; got {self.eps!r}")
        if self.std_ddof not in (0, 1):
            raise ValueError(f"std_ddof must be 0 (population std) or 1 (sample std); got {self.std_ddof!r}")
        if self.failed_reward is not None and not math.isfinite(self.failed_reward):
            raise ValueError(f"failed_reward must be a finite number or None (mask failed rollouts); "
                             f"got {self.failed_reward!r}")
        if self.context_exceeded not in CONTEXT_RULES:
            raise ValueError(f"context_exceeded must be one of {', '.join(CONTEXT_RULES)}; got "
                             f"{self.context_exceeded!r}")
        if self.max_prompt_tokens < 0 or self.max_response_tokens < 0:
            raise ValueError(f"max_prompt_tokens and max_response_tokens must be >= 0 (0: no cap); got "
                             f"{self.max_prompt_tokens!r} and {self.max_response_tokens!r}")
        if isinstance(self.include_modes, str):
            raise ValueError(f"include_modes must be a tuple of modes, e.g. ('train',); got {self.include_modes!r}")
        if isinstance(self.train_purposes, str) or not set(self.train_purposes) <= set(CALL_PURPOSES):
            raise ValueError(f"train_purposes must be a tuple of {', '.join(CALL_PURPOSES)}; "
                             f"got {self.train_purposes!r}")
        object.__setattr__(self, "train_purposes", tuple(self.train_purposes))


# Calls -> fragments.


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
    """Split a rollout's calls into fragments (``per_call``: one per call; ``prefix_merge``: its prefix chains).

    With ``prefix_merge`` a call joins the chain of its purpose whose tokens so far its prompt starts with (the
    longest, should several): calls that interleave (a subagent's inside its parent's, side calls) each stay on
    their own chain; a prompt that extends none (after a compaction rewrote the history, a new subagent) starts a
    chain. Every sampled token is in exactly one fragment, with mask 1 there (property-tested over generated call
    graphs: tests/unit/test_sample_chains.py)."""
    check_mode(mode)
    kept, skipped = usable_calls(calls, train_purposes)
    out: list[Fragment] = []
    chains: dict[str, list[Fragment]] = defaultdict(list)
    for call in kept:
        prompt = call.prompt_ids or []
        if mode == "prefix_merge":
            tips = [f for f in chains[call.purpose] if extends(f, prompt)]
            if tips:
                chain = max(tips, key=lambda f: len(f.input_ids))
                chain.add(call, prompt[len(chain.input_ids):])
                continue
        fragment = Fragment()
        fragment.add(call, prompt)
        out.append(fragment)
        chains[call.purpose].append(fragment)
    return out, skipped


# Row weights.


def rollout_weights(sampled: Sequence[int]) -> list[float]:
    """Each row's share of the rollout's sampled tokens (1/n_rows each when nothing was sampled)."""
    total = sum(sampled)
    if total <= 0:
        return [1.0 / len(sampled)] * len(sampled)
    return [n / total for n in sampled]


def row_weights(sampled: Sequence[int], weighting: str = "rollout") -> list[float]:
    """Weights of one rollout's rows, given each row's number of sampled (mask=1) tokens."""
    check_weighting(weighting)
    if not sampled:
        return []
    if weighting == "fragment":
        return [1.0] * len(sampled)
    return rollout_weights(sampled)


# GRPO advantages and masking.


def group_key(rollout: RolloutRecord) -> str:
    """The GRPO group: ``group_id``, else the task, else the rollout alone."""
    return rollout.group_id or rollout.task_id or rollout.rollout_id


def ended_on_context(rollout: RolloutRecord) -> int | None:
    """The seq of the call the rollout ended on when it was refused as longer than the model's context."""
    seq = rollout.metadata.get("context_exceeded_seq")
    return None if seq is None else int(seq)


def masked_reason(rollout: RolloutRecord, include_modes: Collection[str] | None = None,
                  failed_reward: float | None = None, context_rule: str = "zero_reward") -> str | None:
    """Why the rollout must not be trained on (None when it can); with ``failed_reward`` set, a failed rollout
    is trained on with that reward instead of being masked; ``context_rule`` ``mask`` masks a rollout that ended
    on a call refused as too long."""
    if include_modes is not None and rollout.mode not in include_modes:
        return f"mode {rollout.mode} not included ({', '.join(include_modes)})"
    if context_rule == "mask" and (seq := ended_on_context(rollout)) is not None:
        return f"ended on call {seq}, refused as longer than the context (samples.context_exceeded=mask)"
    if rollout.status == "failed":
        if failed_reward is not None:
            return None
        return f"infrastructure failure: {rollout.failure_reason or 'no reward recorded'}"
    if rollout.status in ("pending", "running"):
        return f"rollout {rollout.status}: not finished"
    if rollout.reward is None:
        return "no reward"
    if not math.isfinite(rollout.reward):
        return f"non-finite reward {rollout.reward}"
    return None


def training_reward(rollout: RolloutRecord, failed_reward: float | None = None) -> float | None:
    """The reward a rollout trains with: its own, or ``failed_reward`` for a failed rollout when that is set."""
    if rollout.status == "failed" and failed_reward is not None:
        return float(failed_reward)
    return rollout.reward


def group_advantages(rewards: Sequence[float], scale: str = "group", eps: float = 1e-4,
                     ddof: int = 0) -> list[float]:
    """Advantages of one group's valid rewards, in order (``ddof``: 0 population std, 1 sample std)."""
    check_scale(scale)
    if len(rewards) < 2:
        return [0.0] * len(rewards)
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - ddof))
    if std == 0.0:
        return [0.0] * len(rewards)
    denom = std + eps if scale == "group" else 1.0
    return [(r - mean) / denom for r in rewards]


def advantages(rollouts: Iterable[RolloutRecord], scale: str = "group", eps: float = 1e-4,
               include_modes: Collection[str] | None = None, ddof: int = 0,
               failed_reward: float | None = None, context_rule: str = "zero_reward") -> dict[str, float]:
    """Rollout id -> advantage, groups formed by :func:`group_key`; masked rollouts get 0.0."""
    out: dict[str, float] = {}
    groups: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for rollout in rollouts:
        reward = training_reward(rollout, failed_reward)
        if masked_reason(rollout, include_modes, failed_reward, context_rule) is None and reward is not None:
            groups[group_key(rollout)].append((rollout.rollout_id, float(reward)))
        else:
            out[rollout.rollout_id] = 0.0
    for members in groups.values():
        values = group_advantages([reward for _, reward in members], scale, eps, ddof)
        out.update({rollout_id: a for (rollout_id, _), a in zip(members, values, strict=True)})
    return out


# Length caps (Agent Lightning's trajectory_max_prompt_length / trajectory_max_response_length).


def prompt_length(fragment: Fragment) -> int:
    """Tokens before the fragment's first sampled token (all of them when nothing was sampled)."""
    return next((i for i, m in enumerate(fragment.loss_mask) if m), len(fragment.loss_mask))


def capped(fragment: Fragment, max_prompt_tokens: int = 0, max_response_tokens: int = 0) -> Fragment | None:
    """The fragment under the caps (0: none): None when its prompt is longer than ``max_prompt_tokens``; else
    cut ``max_response_tokens`` tokens after its first sampled token (token order is never changed)."""
    start = prompt_length(fragment)
    if max_prompt_tokens and start > max_prompt_tokens:
        return None
    if not max_response_tokens or len(fragment.input_ids) - start <= max_response_tokens:
        return fragment
    end = start + max_response_tokens
    return Fragment(list(fragment.call_seqs), fragment.input_ids[:end], fragment.loss_mask[:end],
                    fragment.old_logprobs[:end], list(fragment.missing_logprob_seqs))

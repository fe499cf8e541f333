"""Branching rollouts become rows without loss: a rollout's calls form several prefix chains (a compaction that
rewrites the history, subagents interleaved with their parent, side calls), each chain is merged into one row,
every sampled token is trained exactly once, and a rollout's row weights sum to 1 (property tests over generated
call graphs)."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from repro.store import CallRecord, RolloutRecord
from repro.train.samples import SampleConfig, build_sample_set
from repro.train.samples.rows import fragments

# A step of a generated rollout: which chain the call continues (an index into the chains so far; past the end: a
# new chain), whether it branches off its chain's first call instead of its tip (a rewritten history), its purpose,
# and the new prompt and completion tokens.
STEP = st.tuples(st.integers(0, 4), st.booleans(), st.sampled_from(["policy", "policy", "summary"]),
                 st.lists(st.integers(1, 50), min_size=1, max_size=4), st.lists(st.integers(51, 99), min_size=1,
                                                                                 max_size=4))


def rollout_calls(steps: list[tuple[int, bool, str, list[int], list[int]]],
                  ) -> tuple[list[CallRecord], list[tuple[int, int]]]:
    """The calls of a generated rollout (seq order), and the (call, call it continues at the tip) pairs."""
    chains: list[tuple[str, list[int], list[int], int]] = []  # (purpose, first call's tokens, tip's tokens, tip seq)
    calls, continues = [], []
    for seq, (which, branch, purpose, new_prompt, completion) in enumerate(steps):
        same = which < len(chains) and chains[which][0] == purpose
        if same:
            _, first, tip, tip_seq = chains[which]
            branch = branch and first != tip  # off a chain of one call, a branch is its continuation
            prompt = (first if branch else tip) + new_prompt
        else:
            prompt = [seq + 100, *new_prompt]  # a first token no other prompt has: a chain of its own
        calls.append(CallRecord("r", seq, "chat", "ok", prompt_ids=prompt, completion_ids=completion,
                                logprobs=[-0.25] * len(completion), purpose=purpose))
        whole = prompt + completion
        if same and not branch:
            continues.append((seq, tip_seq))
            chains[which] = (purpose, chains[which][1], whole, seq)
        else:
            chains.append((purpose, whole, whole, seq))
    return calls, continues


@settings(max_examples=300, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=12))
def test_every_sampled_token_is_trained_exactly_once(steps: list) -> None:
    calls, _ = rollout_calls(steps)
    parts, skipped = fragments(calls)
    assert not skipped
    assert sorted(s for p in parts for s in p.call_seqs) == [c.seq for c in calls]  # each call in one row
    by_seq = {c.seq: c for c in calls}
    for part in parts:
        sampled = [t for t, m in zip(part.input_ids, part.loss_mask, strict=True) if m]
        assert sampled == [t for s in part.call_seqs for t in by_seq[s].completion_ids]  # in order, nothing else
        assert len(part.old_logprobs) == len(part.input_ids)


@settings(max_examples=300, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=12))
def test_each_chain_is_one_row_and_interleaving_does_not_split_it(steps: list) -> None:
    calls, continues = rollout_calls(steps)
    merged, _ = fragments(calls)
    starts = {part.call_seqs[0] for part in merged}
    assert not starts & {seq for seq, _ in continues}  # a call at a chain's tip joins a row (its own, or one
    row_of = {seq: i for i, part in enumerate(merged) for seq in part.call_seqs}  # with the same tokens so far)
    for seq, tip in continues:
        row = merged[row_of[seq]]
        assert row.input_ids[:len(calls[tip].prompt_ids)] == calls[tip].prompt_ids
    per_call, _ = fragments(calls, mode="per_call")
    assert len(per_call) == len(calls) and len(merged) <= len(calls)
    for part in merged:  # a row's calls each extend the row so far: a chain, never two glued together
        seqs = part.call_seqs
        for a, b in itertools.pairwise(seqs):
            assert calls[b].prompt_ids[:len(calls[a].prompt_ids)] == calls[a].prompt_ids


def test_a_subagent_inside_its_parent_leaves_the_parents_chain_whole() -> None:
    """Parent, subagent, parent again: two rows (a merge that tried only the latest row made three, the parent's
    second call a row of its own)."""
    parent0 = CallRecord("r", 0, "chat", "ok", prompt_ids=[1, 2], completion_ids=[60], logprobs=[-1.0])
    sub = CallRecord("r", 1, "chat", "ok", prompt_ids=[9, 9], completion_ids=[61], logprobs=[-1.0])
    parent1 = CallRecord("r", 2, "chat", "ok", prompt_ids=[1, 2, 60, 3], completion_ids=[62], logprobs=[-1.0])
    parts, _ = fragments([parent0, sub, parent1])
    assert [p.call_seqs for p in parts] == [[0, 2], [1]]
    assert (parts[0].input_ids, parts[0].loss_mask) == ([1, 2, 60, 3, 62], [0, 0, 1, 0, 1])


@settings(max_examples=200, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=10), st.sampled_from(["rollout", "fragment"]))
def test_rollout_weights_sum_to_one_whatever_the_branching(steps: list, weighting: str) -> None:
    calls, _ = rollout_calls(steps)
    pairs = [(RolloutRecord("r", task_id="t", group_id="t", status="finished", reward=1.0), calls),
             (RolloutRecord("q", task_id="t", group_id="t", status="finished", reward=0.0),
              [CallRecord("q", 0, "chat", "ok", prompt_ids=[7], completion_ids=[70], logprobs=[-1.0])])]
    rows = [r for r in build_sample_set(pairs, SampleConfig(weighting=weighting)).rows if r.rollout_id == "r"]
    total = sum(r.weight for r in rows)
    assert math.isclose(total, 1.0) if weighting == "rollout" else total == len(rows)


def test_inspect_names_each_rows_chain() -> None:
    from repro.train.samples.build import chain_labels

    parent0 = CallRecord("r", 0, "chat", "ok", prompt_ids=[1, 2], completion_ids=[60], logprobs=[-1.0])
    sub = CallRecord("r", 1, "chat", "ok", prompt_ids=[9, 9], completion_ids=[61], logprobs=[-1.0])
    summary = CallRecord("r", 2, "chat", "ok", prompt_ids=[5], completion_ids=[63], logprobs=[-1.0], purpose="summary")
    parent1 = CallRecord("r", 3, "chat", "ok", prompt_ids=[1, 2, 60, 3], completion_ids=[62], logprobs=[-1.0])
    calls = [parent0, sub, summary, parent1]
    rows = build_sample_set([(RolloutRecord("r", task_id="t", status="finished", reward=1.0), calls)]).rows
    assert [r.call_seqs for r in rows] == [[0, 3], [1], [2]]
    assert chain_labels(rows, {c.seq: c.purpose for c in calls}) == [
        "policy, first chain", "policy, new chain", "summary, first chain"]

"""The context profile of a rollout (issue 56): its rows are its prefix chains, a refusal and the outcome come from
its report; per window, the harness is told to compact only where the arm's margin fits in the headroom."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness_adapters.cli_agents import CodexConfig
from harness_adapters.opencode import OpenCodeConfig
from harness_adapters.openhands import OpenHandsConfig
from repro.experiments.context_profile import (
    RolloutContext,
    arm_config,
    compaction_at,
    rollout_context,
    summarize,
)
from repro.store import CallRecord


def call(seq: int, prompt: list[int], status: str = "ok", purpose: str = "policy") -> CallRecord:
    done = status == "ok"
    return CallRecord("r", seq, "chat", status, prompt_ids=prompt if done else None,
                      completion_ids=[90 + seq] if done else None, logprobs=[-0.5] if done else None,
                      prompt_tokens=len(prompt), purpose=purpose)


def report(refusals: int = 0, exceeded: bool = False, outcome: str = "unresolved") -> SimpleNamespace:
    return SimpleNamespace(context_refusals=refusals, context_exceeded=exceeded, outcome=outcome,
                           infra_failure=False)


def test_a_compacted_rollout_has_a_row_per_chain() -> None:
    calls = [call(0, [1, 2]), call(1, [1, 2, 90, 3]), call(2, [1, 2, 90, 3, 91, 4, 5], "context_exceeded"),
             call(3, [7, 8], purpose="summary"), call(4, [1, 2, 6])]  # the summary, then a rewritten history
    profile = rollout_context(calls, report(refusals=1))
    assert (profile.calls, profile.rows, profile.refusals, profile.first_prompt) == (5, 3, 1, 2)
    linear = rollout_context(calls[:2], report(outcome="resolved"))
    assert (linear.rows, linear.resolved) == (1, True)


def test_summary_counts_shares_and_leaves_infrastructure_failures_out_of_pass_at_1() -> None:
    profiles = [RolloutContext(3, 1, 0, False, True, False, 100), RolloutContext(5, 3, 1, False, False, False, 100),
                RolloutContext(2, 1, 1, True, False, False, 120), RolloutContext(1, 1, 0, False, False, True, 90)]
    row = summarize(profiles)
    assert row["rollouts"] == 4 and row["infra_failures"] == 1
    assert row["pass_at_1"] == pytest.approx(1 / 3) and row["context_exceeded"] == pytest.approx(1 / 3)
    assert (row["refused"], row["several_rows"]) == (0.5, 0.25)
    assert (row["calls_max"], row["rows_max"], row["first_prompt_max"]) == (5, 3, 120)


def test_compaction_is_set_only_where_the_margin_fits_the_headroom() -> None:
    codex = {"label": "codex", "harness": "codex", "compaction": "compacting_below", "margin": 3000}
    assert compaction_at(codex, None) is None and compaction_at(codex, 1024) is None
    assert compaction_at(codex, 8192) == "compacting_below"
    cfg = arm_config(codex, 40_000, "compacting_below")
    assert isinstance(cfg, CodexConfig) and cfg.context_window == 40_000
    assert cfg.extra_args[-2:] == ["-c", "model_auto_compact_token_limit=37000"]
    assert arm_config(codex, 40_000, None) == CodexConfig()  # left as it comes
    opencode = {"label": "opencode", "harness": "opencode", "compaction": "context_limit"}
    assert compaction_at(opencode, 1024) == "context_limit"
    assert arm_config(opencode, 21_000, "context_limit") == OpenCodeConfig(context_limit=21_000)


def test_a_time_limit_goes_where_the_harness_takes_one() -> None:
    codex = arm_config({"label": "c", "harness": "codex"}, None, None, time_limit_s=60)
    assert codex.wall_time_limit_s == 60
    openhands = {"label": "o", "harness": "openhands", "config": {"max_iterations": 30}}
    assert arm_config(openhands, None, None, time_limit_s=60) == OpenHandsConfig(max_iterations=30)

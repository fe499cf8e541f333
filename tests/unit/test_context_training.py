"""RL on branching rollouts (issue 56): the window rule, the arms' configs, how training rollouts branched (from a
real SQLite store) and the table's contrasts (an arm minus the ``rollout`` arm, pooled over seeds and per seed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.experiments.context_training import (
    ContextArm,
    ContextTrainingConfig,
    arm_rl,
    prompt_lengths,
    training_context,
    window_rule,
)
from repro.report.context_training_table import context_training_markdown, contrast_row
from repro.rl.config import RLConfig
from repro.store import CallRecord, GroupCommitWriter, RolloutRecord, TraceStoreConfig, open_store


def test_the_window_is_the_longest_first_prompt_plus_max_tokens_plus_steps_of_median_growth() -> None:
    lengths = [[100, 140, 180], [110, 150], [90, 190], [105]]  # growth a call: 40, 40, 100; the last has none
    rule = window_rule(lengths, max_tokens=96, steps=1.5)
    assert (rule["first_prompt_max"], rule["step_growth_median"]) == (110, 40)
    assert rule["window"] == 110 + 96 + 60
    assert rule["probe_rollouts"] == 4 and rule["probe_calls_mean"] == pytest.approx(2.0)


def test_no_window_from_a_probe_without_a_second_call() -> None:
    with pytest.raises(RuntimeError, match="does not act in this harness"):
        window_rule([[100], [120]], max_tokens=96, steps=1.5)


def test_arms_are_checked_and_each_gets_its_weighting_and_seed() -> None:
    with pytest.raises(ValueError, match="condenser"):
        ContextArm("x", condenser="off")
    with pytest.raises(ValueError, match="distinct"):
        ContextTrainingConfig(arms=[{"name": "a"}, {"name": "a", "weighting": "fragment"}])
    cfg = ContextTrainingConfig(arms=[{"name": "fragment", "weighting": "fragment"}])
    assert cfg.arms == [ContextArm("fragment", "fragment", "summarizing")]
    rl = arm_rl(RLConfig(seed=0), cfg.arms[0], seed=2)
    assert (rl.seed, rl.update.seed, rl.update.weighting, rl.rows.weighting) == (2, 2, "fragment", "fragment")
    with pytest.raises(ValueError, match="weighting"):
        arm_rl(RLConfig(), ContextArm("bad", weighting="call"), seed=0)


def _store(tmp_path: Path, rollouts: dict[str, tuple[str, list[CallRecord]]]) -> Path:
    config = TraceStoreConfig(path=str(tmp_path / "traces.sqlite"))
    store = open_store(config.path)
    for rid, (mode, _) in rollouts.items():
        store.create_rollout(RolloutRecord(rid, task_id=f"t-{rid}", mode=mode))
    store.close()
    writer = GroupCommitWriter(config)
    for _, calls in rollouts.values():
        for c in calls:
            writer.write_sync(c)
    writer.close()
    return Path(config.path)


def _call(rid: str, seq: int, prompt: list[int], status: str = "ok", purpose: str = "policy") -> CallRecord:
    done = status == "ok"
    return CallRecord(rid, seq, "chat", status, prompt_ids=prompt if done else None,
                      completion_ids=[90 + seq] if done else None, logprobs=[-0.5] if done else None,
                      prompt_tokens=len(prompt), purpose=purpose)


def test_training_rollouts_are_counted_by_their_chains_refusals_and_ends(tmp_path: Path) -> None:
    refused = _call("c", 2, [1, 2, 90, 3, 91, 4], "context_exceeded")
    condensed = [_call("c", 0, [1, 2]), _call("c", 1, [1, 2, 90, 3]), refused, _call("c", 3, [7, 8], purpose="summary"),
                 _call("c", 4, [1, 2, 6])]  # 3 chains, recovered
    ended = [_call("e", 0, [1, 2]), _call("e", 1, [1, 2, 90, 3, 4], "context_exceeded")]  # ended on the refusal
    linear = [_call("l", 0, [1, 2]), _call("l", 1, [1, 2, 90, 3])]
    held_out = [_call("h", 0, [5]), _call("h", 1, [6])]  # an evaluation rollout: not training
    path = _store(tmp_path, {"c": ("train", condensed), "e": ("train", ended), "l": ("train", linear),
                             "h": ("eval", held_out)})
    got = training_context(path)
    assert got["rollouts"] == 3 and got["rows_max"] == 3
    assert got["rows_mean"] == pytest.approx((3 + 1 + 1) / 3)
    assert got["several_rows"] == pytest.approx(1 / 3)
    assert got["refused"] == pytest.approx(2 / 3) and got["ended_on_refusal"] == pytest.approx(1 / 3)
    assert prompt_lengths(path, "eval") == [[1, 1]]


def _arm(name: str, seed: int, per_instance: dict[str, float], delta: float = 0.0) -> dict:
    zero = {"rows_mean": 1.0, "several_rows": 0.0, "refused": 0.0, "ended_on_refusal": 0.0}
    return {"arm": name, "seed": seed, "weighting": "fragment" if name == "fragment" else "rollout",
            "condenser": "summarizing", "per_instance": per_instance, "paired_vs_warm": {"delta": delta, "mde": 0.1},
            "training": zero,
            "context": {"refused": 0.0, "context_exceeded": 0.0, "rows_mean": 1.0, "several_rows": 0.0},
            "after": {"pass_at_1": sum(per_instance.values()) / len(per_instance)}}


def test_an_arm_is_compared_with_the_rollout_arm_pooled_and_seed_by_seed() -> None:
    ids = [f"i{k}" for k in range(10)]
    rollout = [_arm("rollout", s, {i: float(k < 4) for k, i in enumerate(ids)}) for s in (0, 1)]
    fragment = [_arm("fragment", 0, {i: float(k < 6) for k, i in enumerate(ids)}),   # +20 points on seed 0
                _arm("fragment", 1, {i: float(k < 5) for k, i in enumerate(ids)}),   # +10 on seed 1
                _arm("fragment", 2, {i: 1.0 for i in ids})]                         # seed 2: no rollout arm to pair
    for arms, shas in ((rollout, ["a", "b"]), (fragment, ["a", "c", "d"])):  # seed 0: the same weights
        for arm, sha in zip(arms, shas, strict=True):
            arm["weights_sha256"] = sha
    row = contrast_row("fragment", fragment, rollout)
    assert row["same trained weights"] == "1 of 2 seeds"
    assert row["comparison"] == "fragment minus rollout" and row["seeds"] == "0,1"
    assert row["each seed"] == "+20.0, +10.0"
    assert row["difference [95% CI]"].startswith("+15.0 [")
    flipped = contrast_row("rollout", rollout, fragment[:2])
    assert flipped["each seed"] == "-20.0, -10.0"


def test_the_table_names_the_window_the_arms_and_the_arms_left_for_budget() -> None:
    ids = [f"i{k}" for k in range(10)]
    warm = {i: float(k < 3) for k, i in enumerate(ids)}
    run = {"harness": "openhands@1.58.2", "fingerprint": "f", "train_tasks": "t", "task_distribution": "bundled:x",
           "run_dir": "outputs/context_training/x", "seed": 0, "overrides": ["experiment=context_training"],
           "window": {"window": 266, "first_prompt_max": 110, "max_tokens": 96, "window_steps": 1.5,
                      "step_growth_median": 40, "probe_rollouts": 16, "probe_calls_mean": 3.1},
           "rl": {"steps": 6, "tasks_per_step": 4, "samples_per_task": 8}, "warm_start": {"key": "mix-1"},
           "warm": {"pass_at_1": 0.3}, "warm_per_instance": warm,
           "warm_context": {"refused": 0.5, "context_exceeded": 0.1, "rows_mean": 2.5, "several_rows": 0.75},
           "arms": [_arm("rollout", 0, warm), _arm("fragment", 0, {i: 1.0 for i in ids}, 0.7)],
           "skipped_for_budget": ["rollout_s1", "fragment_s1"]}
    md = context_training_markdown([run])
    assert "W = 266 tokens" in md and "fragment minus rollout" in md and "+70.0 [" in md
    assert "Not run (the run's `context.budget_s` passed first): rollout_s1, fragment_s1." in md


def test_a_run_with_the_models_own_context_says_so_and_an_unknown_window_mode_is_refused() -> None:
    from repro.report.context_training_table import window_sentence

    with pytest.raises(ValueError, match=r"context\.window"):
        ContextTrainingConfig(window="small")
    w = {"window": None, "rule": "room", "first_prompt_max": 333, "step_growth_median": 289.0, "max_tokens": 96,
         "window_steps": 1.5, "probe_rollouts": 16, "probe_calls_mean": 4.0}
    sentence = window_sentence({"harness": "openhands@1.58.2", "window": w})
    assert "the model's own context" in sentence and "W =" not in sentence
    assert "W = 863 tokens" in window_sentence({"harness": "openhands@1.58.2", "window": w | {"window": 863}})

"""RL reward shaping (repro.train.reward): the default is the grader's verdict; Agent Lightning's scope counts
FAIL_TO_PASS and the PASS_TO_PASS tests of the same files; the turn and prompt-length penalties are bounded ramps."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repro.evaluation import Usage
from repro.protocols import GradeResult, HarnessResult
from repro.rl.rollouts import RolloutOptions, RolloutRunner
from repro.store import open_store
from repro.store.trace_records import RolloutRecord
from repro.tasks.schema import Task
from repro.train.reward import GradedRollout, RewardConfig, ramp, rewarded_tests, shaped_reward, task_reward

TASK = Task("t", "o/r", "0" * 40, "text",
            FAIL_TO_PASS=["tests/test_a.py::test_bug"],
            PASS_TO_PASS=["tests/test_a.py::test_ok", "tests/test_b.py::test_far"])
AGL = RewardConfig(tests="same_file", turn_penalty=0.1, turn_penalty_from=80, max_turns=100,
                   prompt_penalty=0.1, prompt_penalty_from=50_000, prompt_penalty_to=64_000)


def statuses(bug: str = "PASSED", ok: str = "PASSED", far: str = "PASSED") -> dict[str, str]:
    return {"tests/test_a.py::test_bug": bug, "tests/test_a.py::test_ok": ok, "tests/test_b.py::test_far": far}


def test_same_file_scope_counts_fail_to_pass_and_its_files_pass_to_pass_only() -> None:
    assert rewarded_tests(TASK, "same_file") == ["tests/test_a.py::test_bug", "tests/test_a.py::test_ok"]
    # a far-away test broken: unresolved for SWE-bench, still rewarded under Agent Lightning's scope
    assert task_reward(TASK, "unresolved", statuses(far="FAILED"), "same_file") == 1.0
    assert task_reward(TASK, "unresolved", statuses(far="FAILED"), "all") == 0.0
    assert task_reward(TASK, "unresolved", statuses(ok="FAILED"), "same_file") == 0.0
    assert task_reward(TASK, "unresolved", statuses(bug="MISSING"), "same_file") == 0.0
    assert task_reward(TASK, "timeout", statuses(), "same_file") == 0.0  # infrastructure outcomes earn nothing


def test_penalties_follow_the_recipe_ramps() -> None:
    assert shaped_reward(TASK, "resolved", statuses(), 80, 50_000, AGL)[0] == 1.0
    reward, parts = shaped_reward(TASK, "resolved", statuses(), 90, 57_000, AGL)
    assert parts == {"task": 1.0, "turn_penalty": pytest.approx(0.05), "prompt_penalty": pytest.approx(0.05)}
    assert reward == pytest.approx(0.9)
    assert shaped_reward(TASK, "resolved", statuses(), 150, 90_000, AGL)[0] == pytest.approx(0.8)


def test_an_unsolved_rollout_earns_exactly_its_task_reward_whatever_its_length() -> None:
    reward, parts = shaped_reward(TASK, "unresolved", statuses(bug="FAILED"), 95, 60_000, AGL)
    assert reward == 0.0 and parts == {"task": 0.0, "turn_penalty": 0.0, "prompt_penalty": 0.0}
    assert shaped_reward(TASK, "timeout", statuses(), 100, 64_000, AGL)[0] == 0.0


def test_a_solved_rollout_pays_both_penalties() -> None:
    reward, parts = shaped_reward(TASK, "resolved", statuses(), 95, 60_000, AGL)
    assert parts["turn_penalty"] == pytest.approx(0.075) and parts["prompt_penalty"] == pytest.approx(0.1 * 10 / 14)
    assert reward == pytest.approx(1.0 - 0.075 - 0.1 * 10 / 14)


@given(lengths=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 200_000)), min_size=2, max_size=8))
def test_an_all_fail_group_has_equal_rewards_and_zero_advantages(lengths: list[tuple[int, int]]) -> None:
    from repro.train.samples import group_advantages

    rewards = [shaped_reward(TASK, "unresolved", statuses(bug="FAILED"), calls, prompt, AGL)[0]
               for calls, prompt in lengths]
    assert set(rewards) == {0.0} and group_advantages(rewards) == [0.0] * len(rewards)


@given(calls=st.integers(0, 500), more=st.integers(0, 100), prompt=st.integers(0, 200_000),
       longer=st.integers(0, 50_000))
def test_penalties_are_bounded_and_never_reward_longer_rollouts(calls: int, more: int, prompt: int,
                                                                longer: int) -> None:
    reward, parts = shaped_reward(TASK, "resolved", statuses(), calls, prompt, AGL)
    assert 0.0 <= parts["turn_penalty"] <= 0.1 and 0.0 <= parts["prompt_penalty"] <= 0.1
    assert reward == pytest.approx(1.0 - parts["turn_penalty"] - parts["prompt_penalty"])
    assert shaped_reward(TASK, "resolved", statuses(), calls + more, prompt + longer, AGL)[0] <= reward
    assert 0.0 <= ramp(calls, 80, 100) <= 1.0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="tests must be one of"):
        RewardConfig(tests="some")
    with pytest.raises(ValueError, match="turn_penalty_from < max_turns"):
        RewardConfig(turn_penalty=0.1, turn_penalty_from=100, max_turns=100)
    with pytest.raises(ValueError, match="prompt_penalty_from < prompt_penalty_to"):
        RewardConfig(prompt_penalty=0.1, prompt_penalty_from=64_000, prompt_penalty_to=50_000)


def _runner_reward(reward: RewardConfig | None, outcome: str, tests: dict[str, str], n_calls: int) -> float:
    runner = RolloutRunner.__new__(RolloutRunner)
    runner.opts = RolloutOptions(mode="train", reward=reward)
    usage = Usage(n_calls=n_calls, prompt_tokens=100_000, completion_tokens=0, longest_prompt=60_000)
    rollout = GradedRollout(TASK, 0, "r", "", HarnessResult("r", "finished"), usage.n_calls, usage.longest_prompt)
    return runner._reward(GradeResult(outcome, "", tests), rollout)


def test_the_rollout_runner_records_the_verdict_by_default_and_the_shaped_reward_when_asked() -> None:
    assert _runner_reward(None, "unresolved", statuses(far="FAILED"), 95) == 0.0
    assert _runner_reward(RewardConfig(), "resolved", statuses(), 95) == 1.0
    # same-file scope rewards it; 95 calls cost 0.075, the longest prompt (60k) 0.1 * 10/14
    expected = 1.0 - 0.075 - 0.1 * 10_000 / 14_000
    assert _runner_reward(AGL, "unresolved", statuses(far="FAILED"), 95) == pytest.approx(expected)



def _recorded_reward(tmp_path: Path, opts: RolloutOptions, outcome: str) -> float | None:
    """The reward ``RolloutRunner._record`` stores (real SQLite) for one graded rollout under ``opts``."""
    store_path = tmp_path / f"traces-{len(list(tmp_path.iterdir()))}.sqlite"
    store = open_store(store_path)
    store.create_run("run")
    store.create_rollout(RolloutRecord("r0", run_id="run", task_id=TASK.instance_id, mode="train"))
    runner = RolloutRunner.__new__(RolloutRunner)
    runner.run_dir, runner.store_path, runner.opts, runner.model_name = tmp_path / "phase", store_path, opts, "m"
    runner._local, runner._opened = threading.local(), []
    try:
        runner._record(TASK, 0, "r0", HarnessResult("r0", "finished", n_model_calls=3), GradeResult(outcome), "diff",
                       time.time())
        return store.get_rollout("r0").reward
    finally:
        for opened in runner._opened:
            opened.close()
        store.close()


def test_a_reward_hook_replaces_the_recorded_reward_and_sees_the_rollout(tmp_path: Path) -> None:
    seen: list[tuple[str, GradedRollout]] = []

    def hook(grade: GradeResult, rollout: GradedRollout) -> float:
        seen.append((grade.outcome, rollout))
        return 0.25 if grade.outcome == "unresolved" else 2.0

    assert _recorded_reward(tmp_path, RolloutOptions(mode="train", write_preds=False), "unresolved") == 0.0  # control
    hooked = RolloutOptions(mode="train", write_preds=False, reward_fn=hook)
    assert _recorded_reward(tmp_path, hooked, "unresolved") == 0.25
    assert _recorded_reward(tmp_path, hooked, "resolved") == 2.0
    outcome, rollout = seen[0]
    assert outcome == "unresolved" and rollout.task is TASK and rollout.rollout_id == "r0" and rollout.patch == "diff"
    assert rollout.harness.n_model_calls == 3 and rollout.n_calls == 0  # the store's count: no call was recorded
    # an infrastructure failure gets no reward, hook or not: it says nothing about the policy
    assert _recorded_reward(tmp_path, hooked, "error") is None

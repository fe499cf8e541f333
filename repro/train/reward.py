"""The RL reward of a graded rollout: which tests count, and Agent Lightning's turn and prompt-length penalties.

Pass@1 never uses this: evaluation keeps SWE-bench's verdict (``resolved``: every FAIL_TO_PASS and PASS_TO_PASS
test passes). The default (``tests=all``, no penalties) is that verdict as 1.0 / 0.0, so the miniature's rewards
are unchanged. Agent Lightning's SWE recipe (see ``repro/conf/experiment/agl_swebench_qwen35_9b.yaml``) rewards
FAIL_TO_PASS plus the PASS_TO_PASS tests that live in the same test files, minus two penalties, each a linear ramp
(our reading of "from turn 80, lambda 0.1" and "from 50k to 64k tokens, at most 0.1"):

* turns: ``turn_penalty * min(1, (calls - turn_penalty_from) / (max_turns - turn_penalty_from))`` past
  ``turn_penalty_from`` model calls;
* prompt length: ``prompt_penalty * min(1, (longest_prompt - prompt_penalty_from) / (prompt_penalty_to -
  prompt_penalty_from))`` past ``prompt_penalty_from`` prompt tokens (the rollout's longest prompt).

Both penalties apply only to SOLVED rollouts (task reward >= 1), as in Agent Lightning's SWE agent
(``examples/swe_smith/agents/smith_agent.py``: ``length_penalized_reward`` and ``prompt_length_penalty``): an
unsolved rollout earns exactly its task reward, 0.0, so an all-fail group has all-equal rewards (advantage 0)
instead of small penalty differences that group standardization would blow up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from swebench.harness.grading import test_passed

from repro.protocols import GradeResult, HarnessResult
from repro.tasks.schema import Task

TEST_SCOPES = ("all", "same_file")


@dataclass
class RewardConfig:
    """What a graded RL rollout earns (``rl.reward``); 0 turns a penalty off."""

    tests: str = "all"  # all: SWE-bench's resolved | same_file: FAIL_TO_PASS + PASS_TO_PASS in their test files
    turn_penalty: float = 0.0  # taken off a solved rollout's reward at max_turns, growing from turn_penalty_from
    turn_penalty_from: int = 0  # the turn the penalty starts at
    max_turns: int = 100  # the turn at which the whole turn_penalty applies
    prompt_penalty: float = 0.0  # taken off a solved rollout's reward for its longest prompt, growing linearly
    prompt_penalty_from: int = 0  # prompt tokens where it starts
    prompt_penalty_to: int = 0  # prompt tokens where all of it applies

    def __post_init__(self) -> None:
        if self.tests not in TEST_SCOPES:
            raise ValueError(f"rl.reward.tests must be one of {TEST_SCOPES}, got {self.tests!r}")
        if self.turn_penalty and not 0 <= self.turn_penalty_from < self.max_turns:
            raise ValueError(f"rl.reward: the turn penalty needs 0 <= turn_penalty_from < max_turns, got "
                             f"{self.turn_penalty_from} and {self.max_turns}")
        if self.prompt_penalty and not 0 <= self.prompt_penalty_from < self.prompt_penalty_to:
            raise ValueError(f"rl.reward: the prompt-length penalty needs 0 <= prompt_penalty_from < "
                             f"prompt_penalty_to, got {self.prompt_penalty_from} and {self.prompt_penalty_to}")

    @property
    def shaped(self) -> bool:
        """False for the default: the reward is the verdict itself."""
        return self.tests != "all" or bool(self.turn_penalty) or bool(self.prompt_penalty)


def _file(test_id: str) -> str:
    return test_id.split("::", 1)[0]


def rewarded_tests(task: Task, scope: str) -> list[str]:
    """The tests a rollout must pass to earn the task reward under ``scope``."""
    if scope == "all":
        return [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]
    files = {_file(t) for t in task.FAIL_TO_PASS}
    return [*task.FAIL_TO_PASS, *(t for t in task.PASS_TO_PASS if _file(t) in files)]


def task_reward(task: Task, outcome: str, test_status: dict[str, str], scope: str) -> float:
    """1.0 when the rollout passes the tests ``scope`` names, else 0.0 (``all`` is the grader's own verdict)."""
    if scope == "all":
        return float(outcome == "resolved")
    if outcome not in ("resolved", "unresolved"):  # an error or a timeout earns nothing
        return 0.0
    return float(all(test_passed(t, test_status) for t in rewarded_tests(task, scope)))


def ramp(value: float, start: float, end: float) -> float:
    """0 up to ``start``, rising linearly to 1 at ``end`` and staying there."""
    if value <= start:
        return 0.0
    return min(1.0, (value - start) / (end - start))


def shaped_reward(task: Task, outcome: str, test_status: dict[str, str], calls: int, longest_prompt: int,
                  cfg: RewardConfig) -> tuple[float, dict[str, Any]]:
    """The reward and its parts (task reward, turn penalty, prompt-length penalty); the penalties are 0 unless the
    rollout solved its task (task reward >= 1)."""
    base = task_reward(task, outcome, test_status, cfg.tests)
    solved = base >= 1.0
    turns = cfg.turn_penalty * ramp(calls, cfg.turn_penalty_from, cfg.max_turns) if solved and cfg.turn_penalty else 0.0
    prompt = (cfg.prompt_penalty * ramp(longest_prompt, cfg.prompt_penalty_from, cfg.prompt_penalty_to)
              if solved and cfg.prompt_penalty else 0.0)
    return base - turns - prompt, {"task": base, "turn_penalty": turns, "prompt_penalty": prompt}


@dataclass(frozen=True)
class GradedRollout:
    """What a reward hook is given besides the grade: the rollout's task, sample, patch, how its harness ended,
    and its model calls and longest prompt (in tokens) from the store."""

    task: Task
    sample: int
    rollout_id: str
    patch: str
    harness: HarnessResult
    n_calls: int
    longest_prompt: int


RewardFn = Callable[[GradeResult, GradedRollout], float]  # a reward hook: (grade, rollout) -> reward


def default_reward(cfg: RewardConfig | None) -> RewardFn:
    """The reward RL records without a hook: the verdict as 1.0 / 0.0, or ``cfg``'s shaped reward."""
    def reward(grade: GradeResult, rollout: GradedRollout) -> float:
        if cfg is None or not cfg.shaped:
            return float(grade.outcome == "resolved")
        return shaped_reward(rollout.task, grade.outcome, grade.tests, rollout.n_calls, rollout.longest_prompt,
                             cfg)[0]

    return reward

"""repro: train and evaluate LLM coding agents with RL inside the unchanged harness they ship with.

The public API (imported on first use, so ``import repro`` stays light; type checkers and IDEs read the
``TYPE_CHECKING`` block):

* :class:`RLTrainer` / :class:`RLConfig` — RL of a checkpoint in a harness (``RLTrainer(model, harness,
  train_tasks, args).fit()`` -> :class:`StepRecord` s; ``evaluate()`` -> :class:`EvalResult`), a reward hook
  (:data:`RewardFn`, given the grade and the :class:`GradedRollout`);
* :class:`RLLoop` — the same loop on a server you run (:func:`running_stack` with :class:`CpuServingConfig` /
  :class:`VllmServingConfig` / :class:`EndpointServingConfig` and :class:`ProxyConfig`; :func:`stage_policy`);
* :class:`Evaluator` / :class:`EvalConfig` / :func:`build_spec` — frozen evaluation in the real harness;
* the contracts a harness of your own implements (:class:`HarnessBase` gives the defaults; :class:`Harness`,
  :class:`StreamingHarness`, :class:`HarnessRollout`, :class:`HarnessResult`), the local sandbox, tasks
  (:class:`Task`, :func:`build_distribution`, :func:`load_task_set`), the tiny model.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from repro.protocols import (
        GradeResult,
        Harness,
        HarnessBase,
        HarnessLimits,
        HarnessResult,
        HarnessRollout,
        StreamingHarness,
    )
    from repro.proxy import ProxyConfig
    from repro.rl.checkpoints import stage_policy
    from repro.rl.config import RLConfig
    from repro.rl.evaluator import EvalConfig, EvalResult, Evaluator, build_spec
    from repro.rl.loop import RLLoop
    from repro.rl.steps import StepDiagnostics, StepRecord
    from repro.rl.trainer import RLTrainer
    from repro.sandbox.local import LocalSandbox, LocalSandboxConfig
    from repro.serving.stack import (
        CpuServingConfig,
        EndpointServingConfig,
        Stack,
        VllmServingConfig,
        running_stack,
    )
    from repro.tasks.distributions import TaskDistributionConfig, build_distribution
    from repro.tasks.schema import Task
    from repro.tasks.sets import load_task_set
    from repro.tinymodel.model import TinyModelConfig
    from repro.tinymodel.recipe import tiny_model
    from repro.train.config import UpdateConfig
    from repro.train.reward import GradedRollout, RewardConfig, RewardFn
    from repro.train.samples import SampleConfig
    from repro.train.task_filter import TaskFilterConfig

_EXPORTS = {
    "RLTrainer": "repro.rl.trainer", "RLLoop": "repro.rl.loop", "RLConfig": "repro.rl.config",
    "StepRecord": "repro.rl.steps", "StepDiagnostics": "repro.rl.steps",
    "Evaluator": "repro.rl.evaluator", "EvalConfig": "repro.rl.evaluator", "EvalResult": "repro.rl.evaluator",
    "build_spec": "repro.rl.evaluator", "stage_policy": "repro.rl.checkpoints",
    "running_stack": "repro.serving.stack", "Stack": "repro.serving.stack", "CpuServingConfig": "repro.serving.stack",
    "VllmServingConfig": "repro.serving.stack", "EndpointServingConfig": "repro.serving.stack",
    "ProxyConfig": "repro.proxy",
    "UpdateConfig": "repro.train.config", "SampleConfig": "repro.train.samples", "RewardConfig": "repro.train.reward",
    "RewardFn": "repro.train.reward", "GradedRollout": "repro.train.reward",
    "TaskFilterConfig": "repro.train.task_filter",
    "Harness": "repro.protocols", "StreamingHarness": "repro.protocols", "HarnessBase": "repro.protocols",
    "HarnessLimits": "repro.protocols", "HarnessRollout": "repro.protocols", "HarnessResult": "repro.protocols",
    "GradeResult": "repro.protocols",
    "LocalSandbox": "repro.sandbox.local", "LocalSandboxConfig": "repro.sandbox.local",
    "Task": "repro.tasks.schema", "TaskDistributionConfig": "repro.tasks.distributions",
    "build_distribution": "repro.tasks.distributions", "load_task_set": "repro.tasks.sets",
    "TinyModelConfig": "repro.tinymodel.model", "tiny_model": "repro.tinymodel.recipe",
}
__all__ = [  # the names the TYPE_CHECKING block imports; tests/unit/test_public_api.py keeps the three in step
    "CpuServingConfig", "EndpointServingConfig", "EvalConfig", "EvalResult", "Evaluator", "GradeResult",
    "GradedRollout", "Harness", "HarnessBase", "HarnessLimits", "HarnessResult", "HarnessRollout", "LocalSandbox",
    "LocalSandboxConfig", "ProxyConfig", "RLConfig", "RLLoop", "RLTrainer", "RewardConfig", "RewardFn",
    "SampleConfig", "Stack", "StepDiagnostics", "StepRecord", "StreamingHarness", "Task", "TaskDistributionConfig",
    "TaskFilterConfig", "TinyModelConfig", "UpdateConfig", "VllmServingConfig", "build_distribution", "build_spec",
    "load_task_set", "running_stack", "stage_policy", "tiny_model",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'repro' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return __all__

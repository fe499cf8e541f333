"""repro: train and evaluate LLM coding agents with RL inside the unchanged harness they ship with.

The public API (imported on first use, so ``import repro`` stays light):

* :class:`RLTrainer` / :class:`RLConfig` — RL in a harness through the recording proxy (``fit(tasks)``);
* :class:`Evaluator` / :class:`EvalConfig` / :func:`build_spec` — frozen evaluation in the real harness;
* :func:`running_stack` with :class:`CpuServingConfig` / :class:`VllmServingConfig` / :class:`EndpointServingConfig`
  and :class:`ProxyConfig` — a model server and the proxy in front of it; :func:`stage_policy` — the copy of a
  checkpoint that RL overwrites;
* the contracts a harness of your own implements (:class:`Harness`, :class:`HarnessRollout`, :class:`HarnessResult`),
  the local sandbox, tasks (:class:`Task`, :func:`build_distribution`, :func:`load_task_set`), the tiny model.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "RLTrainer": "repro.rl.trainer", "RLConfig": "repro.rl.config",
    "Evaluator": "repro.rl.evaluator", "EvalConfig": "repro.rl.evaluator", "build_spec": "repro.rl.evaluator",
    "stage_policy": "repro.rl.checkpoints",
    "running_stack": "repro.serving.stack", "Stack": "repro.serving.stack", "CpuServingConfig": "repro.serving.stack",
    "VllmServingConfig": "repro.serving.stack", "EndpointServingConfig": "repro.serving.stack",
    "ProxyConfig": "repro.proxy",
    "UpdateConfig": "repro.train.config", "SampleConfig": "repro.samples", "RewardConfig": "repro.train.reward",
    "TaskFilterConfig": "repro.train.task_filter",
    "Harness": "repro.protocols", "HarnessRollout": "repro.protocols", "HarnessResult": "repro.protocols",
    "GradeResult": "repro.protocols",
    "LocalSandbox": "repro.sandbox.local", "LocalSandboxConfig": "repro.sandbox.local",
    "Task": "repro.tasks.schema", "TaskDistributionConfig": "repro.tasks.distributions",
    "build_distribution": "repro.tasks.distributions", "load_task_set": "repro.tasks.sets",
    "TinyModelConfig": "repro.tinymodel.model", "tiny_model": "repro.tinymodel.recipe",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'repro' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return __all__

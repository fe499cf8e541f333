"""Tasks through a harness, unchanged, with the scripted expert answering: the real CPU server started with the tasks
(``expert_tasks``, as warm starts record demonstrations), the real proxy recording, the real grader, the same
``RolloutRunner`` as a frozen evaluation. What the cost benchmark, the captured fixed texts and the harness tests
share."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

EXPERT_MODEL_LEN = 131072  # a harness's whole first prompt, before any recipe token shortens it


@contextlib.contextmanager
def expert_stack(tasks: list[Any], run_dir: Path, max_model_len: int = EXPERT_MODEL_LEN) -> Iterator[Any]:
    """A running expert server for ``tasks`` (a plain tiny checkpoint: it only tokenizes) and the proxy, with their
    logs and the store (``traces.sqlite``) in ``run_dir``; ``max_model_len``: the context it serves (a longer
    prompt is refused as a model server refuses it)."""
    from repro.proxy import ProxyConfig
    from repro.serving.stack import CpuServingConfig, running_stack
    from repro.tasks.loaders import write_tasks
    from repro.tinymodel.model import TinyModelConfig, build_tiny_model

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    model_dir = build_tiny_model(run_dir / "model", TinyModelConfig(vocab_size=1024), [])
    with running_stack(model_dir, CpuServingConfig(), ProxyConfig(port=0), run_dir,
                       expert_tasks=write_tasks(tasks, run_dir / "tasks.jsonl"),
                       server_overrides={"max_model_len": max_model_len}) as stack:
        yield stack


def run_tasks(harness: Any, stack: Any, tasks: list[Any], folder: Path, store: Path, *, experiment: str,
              max_tokens: int = 256, concurrency: int = 1) -> list[Any]:
    """``tasks`` through ``harness`` on ``stack`` (recorded in its ``store``), graded in a local sandbox, at most
    ``concurrency`` at once; their instance reports."""
    from repro.rl.evaluator import EvalConfig, build_spec, eval_options
    from repro.rl.rollouts import RolloutRunner
    from repro.sandbox.local import LocalSandbox, LocalSandboxConfig

    ev = EvalConfig(experiment=experiment, max_tokens=max_tokens, concurrency=concurrency)
    sandbox = LocalSandbox(LocalSandboxConfig())
    try:
        spec = build_spec(harness, "bundled", tasks, LocalSandboxConfig(), ev, 0, stack.served_model_name)
        runner = RolloutRunner(folder, store, eval_options(spec, ev), tasks, stack, harness, sandbox,
                               stack.served_model_name)
        try:
            return runner.run()
        finally:
            runner.close()
    finally:
        sandbox.close()


def locate_tasks(n_tasks: int, seed: int = 0) -> list[Any]:
    """``n_tasks`` bundled ``locate`` tasks of the train split (the expert takes three calls on each)."""
    from repro.tasks.distributions import TaskDistributionConfig, build_distribution

    return build_distribution(TaskDistributionConfig(seed=seed, split="train", n_tasks=n_tasks,
                                                     families=["procedural"], operators=["recipe"],
                                                     difficulty="locate"))

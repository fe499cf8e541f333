"""The front door: RL of a harness's policy in three lines, with the serving stack started and stopped for you.

    trainer = RLTrainer(model="path/to/checkpoint", harness=my_harness, train_tasks=tasks, args=RLConfig(steps=2))
    steps = trainer.fit()             # typed step records: steps[-1].reward_mean, steps[-1].diagnostics.entropy
    result = trainer.evaluate(tasks)  # the frozen evaluation of the trained policy: result.pass_at_1

``fit`` copies the checkpoint into ``output_dir/policy`` (the copy RL overwrites; the source stays intact), starts
the model server and the recording proxy, runs :class:`~repro.rl.loop.RLLoop` (the advanced form, for a server you
run yourself) and stops them; a second ``fit`` on the same folder resumes after its last finished step.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Self

from repro.protocols import Harness, Sandbox
from repro.proxy.config import ProxyConfig
from repro.rl.checkpoints import stage_policy
from repro.rl.config import RLConfig
from repro.rl.evaluator import EvalConfig, EvalResult, Evaluator
from repro.rl.loop import RLLoop, StepCallback
from repro.rl.steps import StepRecord
from repro.sandbox.local import LocalSandbox
from repro.serving.stack import CpuServingConfig, EndpointServingConfig, VllmServingConfig, running_stack
from repro.tasks.schema import Task
from repro.train.reward import RewardFn

ServingConfig = CpuServingConfig | VllmServingConfig | EndpointServingConfig


class RLTrainer:
    """GRPO of the policy in ``model`` (a transformers checkpoint folder) with rollouts of ``harness`` on
    ``train_tasks``, under ``args``; records, the trained policy and evaluations under ``output_dir``.

    ``sandbox``: where rollouts act and are graded (default: a :class:`~repro.sandbox.local.LocalSandbox` that the
    trainer closes); ``eval_tasks`` / ``eval_args``: what :meth:`evaluate` runs by default; ``serving``: the model
    server (default: repro's CPU server; ``VllmServingConfig()`` on GPUs); ``proxy``: the recording proxy (default:
    a free port on 127.0.0.1); ``reward_fn``: a reward hook (grade, rollout) -> reward (:mod:`repro.train.reward`);
    ``callbacks``: called with each finished step's :class:`~repro.rl.steps.StepRecord`."""

    def __init__(self, model: str | Path, harness: Harness, train_tasks: Sequence[Task],
                 args: RLConfig | None = None, *, sandbox: Sandbox | None = None, eval_tasks: Sequence[Task] = (),
                 eval_args: EvalConfig | None = None, serving: ServingConfig | None = None,
                 proxy: ProxyConfig | None = None, output_dir: str | Path = "outputs/rl",
                 reward_fn: RewardFn | None = None, callbacks: Sequence[StepCallback] = ()) -> None:
        if not list(train_tasks):
            raise ValueError("RLTrainer needs at least one training task (train_tasks is empty)")
        if not (Path(model) / "config.json").exists():
            raise FileNotFoundError(f"no checkpoint at {model}: pass a transformers checkpoint folder (config.json, "
                                    "weights, tokenizer), e.g. the first value of repro.tiny_model(...)")
        self.model, self.harness, self.train_tasks = Path(model), harness, list(train_tasks)
        self.args, self.eval_args = args or RLConfig(), eval_args or EvalConfig()
        self.eval_tasks = list(eval_tasks)
        self.serving, self.proxy = serving or CpuServingConfig(), proxy or ProxyConfig(port=0)
        self.output_dir = Path(output_dir)
        self.reward_fn, self.callbacks = reward_fn, tuple(callbacks)
        self._own_sandbox = LocalSandbox() if sandbox is None else None  # closed by close(); one passed stays yours
        self.sandbox: Sandbox = sandbox if sandbox is not None else self._own_sandbox
        self.steps: list[StepRecord] = []
        self.policy_dir: Path | None = None  # the trained policy, after fit

    def fit(self) -> list[StepRecord]:
        """Stage the policy, start the server and proxy, run the remaining RL steps, stop them; every step's
        record (those of an earlier run of ``output_dir`` first)."""
        self.output_dir.mkdir(parents=True, exist_ok=True)
        policy = stage_policy(self.model, self.output_dir)
        with running_stack(policy, self.serving, self.proxy, self.output_dir) as server:
            loop = RLLoop(server, self.harness, self.sandbox, self.args.with_steps_for(len(self.train_tasks)),
                          self.output_dir, reward_fn=self.reward_fn, callbacks=self.callbacks)
            self.steps = loop.fit(self.train_tasks)
        self.policy_dir = policy
        return self.steps

    def evaluate(self, tasks: Sequence[Task] | None = None, label: str | None = None) -> EvalResult:
        """The frozen evaluation (``eval_args``) of the trained policy (before :meth:`fit`: the starting
        checkpoint) on ``tasks`` (default ``eval_tasks``) in the harness; reports under ``output_dir/eval_<label>``
        (default label: ``trained`` after :meth:`fit`, else ``start``)."""
        label = label or ("trained" if self.policy_dir else "start")
        tasks = list(tasks if tasks is not None else self.eval_tasks)
        if not tasks:
            raise ValueError("nothing to evaluate: pass tasks or give the trainer eval_tasks")
        model = self.policy_dir or self.model
        with running_stack(model, self.serving, self.proxy, self.output_dir) as server:
            evaluator = Evaluator(server, self.harness, self.sandbox, self.eval_args, task_set=f"eval_{label}")
            return evaluator.evaluate(tasks, self.output_dir / f"eval_{label}", label)

    def close(self) -> None:
        """Close the sandbox the trainer made (one you passed stays yours)."""
        if self._own_sandbox is not None:
            self._own_sandbox.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""The one builder every experiment shares: which model, which server and proxy, which harness and sandbox (the
Hydra groups of those names, as one :class:`Setup`), started and stopped in the right order."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.common.tracking import TrackingConfig
from repro.protocols import Harness, Sandbox
from repro.proxy import ProxyConfig
from repro.sandbox.fanout import FanoutConfig, harness_for
from repro.sandbox.local import LocalSandboxConfig
from repro.sandbox.select import make_sandbox
from repro.serving.stack import Stack, running_stack
from repro.tasks.schema import Task
from repro.tinymodel.model import TinyModelConfig
from repro.tinymodel.recipe import tiny_model


@dataclass
class Setup:
    """What an experiment runs on: ``model`` (the tiny model's recipe, when no checkpoint is given), the model server
    (``serving``: cpu | vllm | endpoint) and ``proxy``, the harness (``harness_name`` and its config ``harness``,
    ``harness_workers`` long-lived processes, optionally fanned out over Ray hosts), the ``sandbox``, and where RL's
    and SFT's diagnostics go (``tracking``)."""

    model: TinyModelConfig
    serving: Any  # CpuServingConfig | VllmServingConfig | EndpointServingConfig
    proxy: ProxyConfig
    harness: Any
    harness_name: str | None = None
    sandbox: Any = None  # LocalSandboxConfig | DockerSandboxConfig (None: local)
    harness_workers: int = 1
    fanout: FanoutConfig | None = None
    tracking: TrackingConfig | None = None

    def __post_init__(self) -> None:
        self.sandbox = self.sandbox or LocalSandboxConfig()

    @property
    def served_model_name(self) -> str:
        return self.serving.served_model_name

    @contextlib.contextmanager
    def harness_and_sandbox(self, workers: int | None = None) -> Iterator[tuple[Harness, Sandbox]]:
        """The live harness and sandbox (closed in reverse order); ``workers``: another number of harness
        processes than ``harness_workers``."""
        logging.getLogger("httpx").setLevel(logging.WARNING)  # swebench's import turns on INFO logging globally
        box = make_sandbox(self.sandbox)
        try:
            with harness_for(self.harness_name, self.harness, self.sandbox, self.fanout,
                             workers or self.harness_workers) as agent:
                yield agent, box
        finally:
            box.close()

    def server(self, model_dir: Path, run_dir: Path, **kwargs: Any) -> contextlib.AbstractContextManager[Stack]:
        """The model server for ``model_dir`` and the proxy in front of it, logs and traces in ``run_dir``
        (``kwargs``: :func:`~repro.serving.stack.running_stack`'s)."""
        return running_stack(Path(model_dir), self.serving, self.proxy, Path(run_dir), **kwargs)


def eval_model(model: TinyModelConfig, ev: Any, tasks: list[Task]) -> tuple[Path, str]:
    """The checkpoint to evaluate (``ev.checkpoint``, an ``EvalConfig``'s; else the tiny offline model) and its name."""
    if ev.checkpoint:
        path = Path(ev.checkpoint).expanduser()
        if not (path / "config.json").exists():
            raise SystemExit(f"checkpoint {path} has no config.json: pass a transformers checkpoint directory "
                             f"(e.g. one written by `repro build-model --out DIR`)")
        return path, path.name
    corpus = [t.problem_statement for t in tasks[:200]]
    path, _ = tiny_model(model, corpus)
    return path, path.name

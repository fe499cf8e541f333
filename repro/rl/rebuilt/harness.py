"""The rebuilt loop behind the ``Harness`` contract: the rollout runner, grading, the store, the sample builder
and the trainer are the ones the real harness uses; only the loop differs (rollouts are tagged ``rebuilt``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from harness_adapters.mini_swe_agent.adapter import (
    MiniSweAgentConfig,
    base_config,
    build_process_env,
    harness_settings,
    harness_tools,
)
from harness_adapters.processes import stream_in_threads
from repro.protocols import HarnessLimits, HarnessResult, HarnessRollout
from repro.rl.rebuilt.mini_swe_agent import WRITTEN_FOR, CompletionClient, LoopSpec, RebuiltLoop

TRAJECTORY_NAME = "rebuilt.traj.json"
LOOP_KINDS = ("proxy", "rebuilt")


@dataclass
class LoopConfig:
    """Who runs the RL rollouts: ``proxy`` = the real harness through the recording proxy; ``rebuilt`` = the
    trainer-owned loop (:class:`RebuiltMiniSweAgentHarness`). Evaluation always uses the real harness."""

    kind: str = "proxy"

    def __post_init__(self) -> None:
        if self.kind not in LOOP_KINDS:
            raise ValueError(f"loop.kind must be one of {LOOP_KINDS}, got {self.kind!r}")


@contextlib.contextmanager
def rl_harness(loop: LoopConfig, harness: Any, policy_dir: Path) -> Iterator[Any]:
    """The harness RL rollouts run in: ``harness`` itself, or the rebuilt loop for its config."""
    if loop.kind == "proxy":
        yield harness
        return
    with RebuiltMiniSweAgentHarness(harness.cfg, policy_dir) as rebuilt:
        yield rebuilt


def loop_spec(cfg: MiniSweAgentConfig, home: Path) -> LoopSpec:
    """What the rebuilt loop takes from the harness config: templates, tools, limits, command env, sampling."""
    if cfg.mode != "toolcall":
        raise ValueError(f"the rebuilt loop reproduces mini-SWE-agent {WRITTEN_FOR}'s tool-call mode, not {cfg.mode!r}")
    if cfg.max_tokens is None:
        raise ValueError("the rebuilt loop needs harness.max_tokens: without it the harness's chat calls get the "
                         "server's default, while /completions defaults to 16 tokens")
    data = base_config(cfg)
    agent, model, environment = data["agent"], data["model"], data.get("environment", {})
    kwargs = harness_settings(cfg)["model"]["model_kwargs"]
    return LoopSpec(
        system_template=agent["system_template"], instance_template=agent["instance_template"],
        observation_template=model["observation_template"], format_error_template=model["format_error_template"],
        tools=harness_tools(cfg), step_limit=cfg.step_limit, wall_time_limit_s=cfg.wall_time_limit_s,
        max_format_errors=int(agent.get("max_consecutive_format_errors", 3)), command_timeout_s=cfg.command_timeout_s,
        command_env=build_process_env(cfg, home=home, config_dir=home) | dict(environment.get("env", {})),
        platform=dict(cfg.platform),
        sampling={k: kwargs[k] for k in ("temperature", "max_tokens") if k in kwargs},
    )


class RebuiltMiniSweAgentHarness:
    """Runs rollouts with :class:`RebuiltLoop` (threads; the model calls go token-in/token-out to the proxy)."""

    name = "mini-swe-agent"
    loop_kind = "rebuilt"
    cfg: MiniSweAgentConfig
    version: str

    def __init__(self, cfg: MiniSweAgentConfig, tokenizer_dir: Path) -> None:
        from transformers import AutoTokenizer

        self.cfg, self.version = cfg, cfg.version
        self._home = Path(tempfile.mkdtemp(prefix="repro-rebuilt-"))
        self.spec = loop_spec(cfg, self._home)
        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))

    @property
    def limits(self) -> HarnessLimits:
        """The limits of the mini-SWE-agent config it rebuilds."""
        return HarnessLimits.of(self.cfg)

    def identity(self) -> dict[str, Any]:
        spec = {k: v for k, v in asdict(self.spec).items() if k != "command_env"}
        digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
        return {"name": self.name, "version": self.version, "loop": self.loop_kind, "written_for": WRITTEN_FOR,
                "config_hash": digest}

    def run(self, rollouts: list[HarnessRollout], concurrency: int) -> list[HarnessResult]:
        with ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="rebuilt") as pool:
            return list(pool.map(self.run_one, rollouts))

    def run_each(self, rollouts: Iterable[HarnessRollout], concurrency: int,
                 on_result: Callable[[HarnessRollout, HarnessResult], None]) -> int:
        """Streaming :meth:`run` (``repro.protocols.StreamingHarness``)."""
        return stream_in_threads(rollouts, max(1, concurrency), self.run_one, on_result, "rebuilt")

    def run_one(self, rollout: HarnessRollout) -> HarnessResult:
        started = time.monotonic()
        client = CompletionClient(rollout.base_url, rollout.model_name, self.spec.sampling)
        spec = replace(self.spec, command_env=self.spec.command_env | rollout.env) if rollout.env else self.spec
        loop = RebuiltLoop(spec, self.tokenizer, client, rollout.workdir, deadline_s=rollout.timeout_s)
        try:
            exit_status = loop.run(rollout.task.problem_statement)
            status, reason = ("timeout", f"ran past {rollout.timeout_s:g} s") if loop.timed_out else \
                ("finished", exit_status)
        except httpx.HTTPError as exc:
            exit_status, status, reason = type(exc).__name__, "crashed", f"model call failed: {exc}"
        finally:
            client.close()
        path = _write_trajectory(rollout.output_dir, loop, exit_status)
        return HarnessResult(rollout.rollout_id, status, reason, exit_status, loop.n_calls,
                             time.monotonic() - started, str(path), {"loop": self.loop_kind})

    def close(self) -> None:
        """Drop the loop's temporary home (its commands' HOME)."""
        import shutil

        shutil.rmtree(self._home, ignore_errors=True)

    def __enter__(self) -> RebuiltMiniSweAgentHarness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write_trajectory(output_dir: Path, loop: RebuiltLoop, exit_status: str) -> Path:
    path = Path(output_dir) / TRAJECTORY_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    messages = loop.conversation.messages if loop.conversation else []
    path.write_text(json.dumps({"exit_status": exit_status, "n_calls": loop.n_calls, "messages": messages,
                                "outputs": loop.outputs}, indent=1))
    return path

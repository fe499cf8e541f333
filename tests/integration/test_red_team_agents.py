"""The red team through OpenCode's and OpenHands' own shell tools (OpenCode's ``bash``, OpenHands' ``terminal``: its
tmux server), unchanged, against the real CPU server's scripted replies: the model asks the harness to take the gold
patch from the task file (the task's row, kept outside the working copy) and apply it. Jailed (the default) there is
no such file and the task does not resolve; the control run without isolation applies it and resolves (so the test
can fail). The npm CLIs' shell tools: ``tests/integration/test_red_team_cli.py``."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import harness_adapters.opencode_env as opencode_env
from harness_adapters.opencode import OpenCodeConfig
from harness_adapters.openhands import OpenHandsConfig, ensure_openhands_env
from harness_adapters.registry import get_harness
from repro.common.venvs import HarnessEnvError, env_root
from repro.execution.jail import jail_available
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.tinymodel.model import TinyModelConfig, build_tiny_model
from tests.integration.test_red_team import REQUIRED, apply_from_task_file, through_shell_tool
from tests.support import npm_registry_unreachable

(TASK,) = build_distribution(TaskDistributionConfig(seed=0, split="test", n_tasks=1, families=["procedural"]))
# OpenHands' first prompt is ~20.5k tokens of the tiny byte-level tokenizer, OpenCode's ~19k: a longer context
MODEL = TinyModelConfig(vocab_size=1024, max_position_embeddings=65536)


def _call(name: str, arguments: dict[str, str]) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def _opencode(command: str) -> list[str]:
    """bash, twice (OpenCode's title request takes turn 1 as well), then a reply without tools ends the run."""
    shell = _call("bash", {"command": command, "description": "Copy the task file"})
    return [shell, shell, "Done."]


def _openhands(command: str) -> list[str]:
    """terminal (its tmux server), twice, then finish."""
    shell = _call("terminal", {"command": command, "security_risk": "LOW"})
    return [shell, shell, _call("finish", {"message": "Done."})]


def _opencode_config(isolation: str) -> Any:
    """Its cached install, built if npm reaches its registry; else skipped, or failed under REPRO_REQUIRE_NPM=1."""
    version = OpenCodeConfig().version
    built = opencode_env.is_valid(env_root(opencode_env.NAME, version), version)
    if not built and (reason := npm_registry_unreachable()):
        message = f"{reason}: cannot install OpenCode {version}"
        (pytest.fail if os.environ.get("REPRO_REQUIRE_NPM") == "1" else pytest.skip)(message)
    opencode_env.ensure_opencode_env(version)
    return OpenCodeConfig(isolation=isolation)


def _openhands_config(isolation: str) -> Any:
    """Its cached env, built on first use (a Python >= 3.12 and PyPI); else skipped."""
    try:
        ensure_openhands_env()
    except HarnessEnvError as exc:
        pytest.skip(f"no OpenHands env here: {str(exc).splitlines()[0]}")
    return OpenHandsConfig(isolation=isolation, max_iterations=6, condenser="none")


HARNESSES = {"opencode": (_opencode, _opencode_config), "openhands": (_openhands, _openhands_config)}


@pytest.fixture(scope="module")
def secret(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The task's row, gold patch included, in a file outside the working copy (as ``tasks.source=FILE`` gives)."""
    path = tmp_path_factory.mktemp("data") / "tasks.jsonl"
    path.write_text(json.dumps(TASK.to_row()) + "\n")
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "model", MODEL, [])


@pytest.mark.parametrize("isolation", ["jail", "none"])
@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_an_agent_cannot_copy_the_task_file_through_its_shell_tool_when_jailed(
        name: str, isolation: str, secret: Path, model_dir: Path, tmp_path: Path) -> None:
    replies, config = HARNESSES[name]
    cfg = config(isolation)
    if isolation == "jail" and jail_available() is not None:
        (pytest.fail if REQUIRED else pytest.skip)(f"no jail here: {jail_available()}")
    command = apply_from_task_file(secret)
    (tmp_path / "scenarios.json").write_text(json.dumps({name: replies(command)}))
    task = replace(TASK, problem_statement=f"SCENARIO {name}. {TASK.problem_statement}")
    with get_harness(name, cfg) as harness:
        assert harness.identity()["settings"]["isolation"] == isolation
        result, leak, resolved = through_shell_tool(harness, task, model_dir, tmp_path, 65536)
    assert result.status == "finished", (result.status, result.reason)
    assert "done" in leak, (result.status, result.reason)  # the shell tool ran in both runs
    if isolation == "jail":
        assert "No such file" in leak and not resolved
    else:
        assert resolved, leak  # the control: unjailed, the agent's shell applies the task file's gold patch

"""The scripted expert end to end: expert server + recording proxy + the real mini-SWE-agent 2.4.6 on procedural
tasks, with the recipe tokenizer. Every rollout is one call that resolves its task; the recorded prompt ids are
the chat template's, and each fixed paragraph of the harness's first prompt is one token of it. On ``locate`` tasks
every rollout is three calls (look the line up, edit it, check and submit) whose observations the harness fed back."""

from __future__ import annotations

import json
import platform
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from transformers import AutoTokenizer

from harness_adapters.mini_swe_agent.adapter import (
    MiniSweAgentConfig,
    ensure_mini_swe_agent_env,
    fixed_prompt_texts,
    harness_tools,
    platform_line,
)
from harness_adapters.template_texts import fixed_template_texts
from repro.sandbox.local import LocalSandbox, LocalSandboxConfig
from repro.store import open_store
from repro.tasks.distributions import TaskDistributionConfig
from repro.tinymodel.vocab import SUBMIT_SUFFIX, tool_call_pieces
from tests import support

TASKS = TaskDistributionConfig(seed=0, split="test", n_tasks=3, families=["procedural"], operators=["recipe"],
                               difficulty="one_step")
LOCATE_TASKS = replace(TASKS, difficulty="locate")
HARNESS = MiniSweAgentConfig(step_limit=4)


@pytest.fixture(scope="module")
def expert_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_expert(tmp_path_factory.mktemp("expert-run"), TASKS)


@pytest.fixture(scope="module")
def locate_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_expert(tmp_path_factory.mktemp("expert-locate"), LOCATE_TASKS)


def run_expert(root: Path, config: TaskDistributionConfig) -> dict:
    """The expert's rollouts of ``config``'s tasks through the real harness in the local sandbox, and their grades."""
    sandbox = LocalSandbox(LocalSandboxConfig())
    try:
        return support.run_expert(root, config, HARNESS, sandbox)
    finally:
        sandbox.close()


def test_every_rollout_submits_one_call_and_resolves(expert_run: dict) -> None:
    for task, result, grade in zip(expert_run["tasks"], expert_run["results"], expert_run["grades"], strict=True):
        assert result.status == "finished" and result.exit_status == "Submitted", result
        assert result.n_model_calls == 1
        assert grade.outcome == "resolved", (task.instance_id, grade.reason)


def test_locate_rollouts_look_edit_check_and_resolve(locate_run: dict) -> None:
    store = open_store(locate_run["store"])
    for i, (task, result, grade) in enumerate(zip(locate_run["tasks"], locate_run["results"], locate_run["grades"],
                                                  strict=True)):
        assert result.status == "finished" and result.exit_status == "Submitted", result
        assert result.n_model_calls == 3
        assert grade.outcome == "resolved", (task.instance_id, grade.reason)
        calls = store.calls(f"expert-{i}")
        commands = [json.loads(c.response["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])
                    ["command"] for c in calls]
        assert [c.split(" ", 1)[0] for c in commands] == ["grep", "sed", "python"]
        line = f"{task.extra['line']}:{task.extra['buggy_line']}"
        assert line in calls[1].request["messages"][-1]["content"], "the grep's output is the edit call's last message"
        assert commands[1].startswith(f"sed -i '{task.extra['line']}s|")


def test_recorded_ids_are_the_chat_templates_and_recipe_tokens(expert_run: dict) -> None:
    tokenizer = AutoTokenizer.from_pretrained(expert_run["model_dir"])
    store = open_store(expert_run["store"])
    first_prompt_texts = _first_prompt_texts()
    assert set(first_prompt_texts) < set(fixed_prompt_texts(HARNESS))
    wrapper = {tokenizer.convert_tokens_to_ids(p) for p in (*tool_call_pieces(), SUBMIT_SUFFIX)}
    for i in range(len(expert_run["tasks"])):
        (call,) = store.calls(f"expert-{i}")
        assert call.prompt_ids and call.completion_ids and call.status == "ok"
        request = call.request
        assert call.prompt_ids == tokenizer.apply_chat_template(
            request["messages"], tools=request["tools"], add_generation_prompt=True, tokenize=True, return_dict=False)
        assert request["tools"] == harness_tools(HARNESS)
        text = "\n".join(m["content"] for m in request["messages"])
        assert all(p in text for p in first_prompt_texts)
        assert {tokenizer.convert_tokens_to_ids(p) for p in first_prompt_texts} <= set(call.prompt_ids)
        assert wrapper <= set(call.completion_ids)
        assert len(call.prompt_ids) < 400 and len(call.completion_ids) < 64


def _first_prompt_texts() -> list[str]:
    """The paragraphs of mini.yaml's system and instance templates, but the macOS-only one."""
    config = yaml.safe_load((ensure_mini_swe_agent_env().site_packages / "minisweagent/config/mini.yaml").read_text())
    texts = fixed_template_texts([config["agent"]["system_template"], config["agent"]["instance_template"]])
    return [t for t in texts if "MacOS" not in t]


def test_platform_line_option_is_the_recorded_system_information(expert_run: dict) -> None:
    extra = set(fixed_prompt_texts(HARNESS, platform_line=True)) - set(fixed_prompt_texts(HARNESS))
    (block,) = [p for p in extra if p.startswith("<system_information>\n")]
    (call,) = open_store(expert_run["store"]).calls("expert-0")
    assert block in call.request["messages"][1]["content"]


def test_the_prompts_platform_line_is_the_pinned_one_not_the_hosts(expert_run: dict) -> None:
    """mini renders ``harness.platform`` (set in its process environment), whatever this machine's kernel is."""
    (call,) = open_store(expert_run["store"]).calls("expert-0")
    instance = call.request["messages"][1]["content"]
    assert f"<system_information>\n{platform_line(HARNESS.platform)}\n</system_information>" in instance
    assert platform_line(HARNESS.platform) == "Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC x86_64"
    if platform.release() != HARNESS.platform["release"]:
        assert platform.release() not in instance

"""The rebuilt loop against the real mini-SWE-agent 2.4.6 on scripted replies: same exits, same calls, same prompts.

One scripted model server (``repro.serving.scripted.scenario_script``) answers both the real harness and the rebuilt
loop through the recording proxy, per scenario: submission, step limit, wall-time limit, repeated format errors (no
tool call; an unknown tool), and a recovery after one format error. For every scenario the rebuilt loop must end
with the harness's exit status after as many calls, and send token for token the prompts the harness sent; the
fidelity replay of the harness's recording must find no divergent turn.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from harness_adapters.mini_swe_agent.adapter import MiniSweAgentConfig
from harness_adapters.mini_swe_agent.pool import MiniSweAgentHarness
from repro.protocols import HarnessRollout
from repro.proxy import ProxyConfig
from repro.rl.rebuilt.fidelity import replay_rollout, summarize
from repro.rl.rebuilt.harness import RebuiltMiniSweAgentHarness
from repro.sandbox.local import LocalSandbox, LocalSandboxConfig
from repro.serving.stack import CpuServingConfig, running_stack
from repro.store import open_store
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.tinymodel.expert import tool_call_text
from repro.tinymodel.model import TinyModelConfig, build_tiny_model

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
SCENARIOS = {
    "submit": [tool_call_text("ls"), tool_call_text(SUBMIT)],
    "steps": [tool_call_text("ls")],
    "slow": [tool_call_text("sleep 3.2")],
    "format": ["The bug is in the second line, I think."],
    "badtool": ['<tool_call>\n{"name": "python", "arguments": {"code": "1"}}\n</tool_call>'],
    "recover": ["Let me look.", tool_call_text("head -3 *.py"), tool_call_text(SUBMIT)],
}
EXPECTED = {"submit": ("Submitted", 2), "steps": ("LimitsExceeded", 3), "slow": ("TimeExceeded", 1),
            "format": ("RepeatedFormatError", 3), "badtool": ("RepeatedFormatError", 3),
            "recover": ("Submitted", 3)}
HARNESS = MiniSweAgentConfig(step_limit=3, wall_time_limit_s=3, max_tokens=64)
TASKS = TaskDistributionConfig(seed=0, split="test", n_tasks=1, families=["procedural"], difficulty="one_step")


def _rollout(stack, sandbox, task, rollout_id: str, root: Path, loop_kind: str) -> HarnessRollout:
    base_url = stack.client.register(rollout_id=rollout_id, task_id=task.instance_id, mode="eval",
                                     loop_kind=loop_kind)
    workspace = sandbox.workspace(task, rollout_id)
    return HarnessRollout(rollout_id, task, workspace.path, base_url,
                          stack.served_model_name, root / "harness" / rollout_id, 60.0)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("rebuilt")
    (root / "scenarios.json").write_text(json.dumps(SCENARIOS))
    model_dir = build_tiny_model(root / "model", TinyModelConfig(vocab_size=1024), [])
    base = build_distribution(TASKS)[0]
    tasks = {name: replace(base, problem_statement=f"SCENARIO {name}. {base.problem_statement}") for name in SCENARIOS}
    sandbox = LocalSandbox(LocalSandboxConfig())
    try:
        with running_stack(model_dir, CpuServingConfig(), ProxyConfig(port=0), root,
                           server_overrides={"scenarios": root / "scenarios.json"}) as stack:
            with MiniSweAgentHarness(HARNESS, workers=1) as harness:
                real = harness.run([_rollout(stack, sandbox, t, f"real-{n}", root, "proxy")
                                    for n, t in tasks.items()], concurrency=len(tasks))
            with RebuiltMiniSweAgentHarness(HARNESS, model_dir) as rebuilt_harness:
                rebuilt = rebuilt_harness.run([_rollout(stack, sandbox, t, f"rebuilt-{n}", root, "rebuilt")
                                               for n, t in tasks.items()], concurrency=len(tasks))
                spec = rebuilt_harness.spec
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        store = open_store(root / "traces.sqlite")
        calls = {key: store.calls(key) for n in SCENARIOS for key in (f"real-{n}", f"rebuilt-{n}")}
        kinds = {r.rollout_id: r.loop_kind for r in store.list_rollouts()}
        replays = [replay_rollout(calls[f"real-{n}"], t.problem_statement, spec, tokenizer,
                                  sandbox.workspace(t, f"replay-{n}").path, f"real-{n}") for n, t in tasks.items()]
        store.close()
    finally:
        sandbox.close()
    return {"real": dict(zip(SCENARIOS, real, strict=True)), "rebuilt": dict(zip(SCENARIOS, rebuilt, strict=True)),
            "calls": calls, "kinds": kinds, "replays": replays}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_real_harness_exits_as_expected(runs: dict, name: str) -> None:
    result = runs["real"][name]
    assert (result.exit_status, result.n_model_calls) == EXPECTED[name], result


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_rebuilt_loop_exits_like_the_harness(runs: dict, name: str) -> None:
    real, rebuilt = runs["real"][name], runs["rebuilt"][name]
    assert (rebuilt.exit_status, rebuilt.n_model_calls) == (real.exit_status, real.n_model_calls), rebuilt
    assert rebuilt.status == "finished"


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_rebuilt_loop_sends_the_harness_prompts_token_for_token(runs: dict, name: str) -> None:
    real, rebuilt = runs["calls"][f"real-{name}"], runs["calls"][f"rebuilt-{name}"]
    assert len(real) == len(rebuilt) == EXPECTED[name][1]
    for turn, (a, b) in enumerate(zip(real, rebuilt, strict=True)):
        assert a.endpoint == "chat" and b.endpoint == "completions"
        assert a.prompt_ids == b.prompt_ids, f"{name}: turn {turn} differs"
        assert a.completion_ids == b.completion_ids and b.logprobs is not None


def test_rollouts_are_tagged_with_their_loop(runs: dict) -> None:
    assert {runs["kinds"][f"real-{n}"] for n in SCENARIOS} == {"proxy"}
    assert {runs["kinds"][f"rebuilt-{n}"] for n in SCENARIOS} == {"rebuilt"}


def test_replay_of_the_recordings_finds_no_divergence(runs: dict) -> None:
    summary = summarize(runs["replays"])
    assert summary["turns"] == sum(n for _, n in EXPECTED.values())
    assert summary["divergence_rate"] == 0.0, summary["example"]
    assert summary["rebuilt_drift_rate"] == 0.0
    exits = {r.rollout_id.removeprefix("real-"): r.rebuilt_exit for r in runs["replays"]}
    assert exits == {n: s for n, (s, _) in EXPECTED.items()}

"""Prefix breaks of the real mini-SWE-agent 2.4.6 with thinking off, by chat template: the scripted expert (three
calls a rollout on ``locate`` tasks) served on Qwen3's tokenizer through the recording proxy and the CPU server, every
call forced to ``chat_template_kwargs: {enable_thinking: false}``. With Qwen3's template every turn's prompt drops the
empty think block the previous generation prompt ended in (a break every turn); with ``model.chat_template=keep_think``
every prompt starts with the previous prompt + sampled completion, token for token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness_adapters.mini_swe_agent.adapter import MiniSweAgentConfig
from repro.evaluation.retokenization import prefix_drift
from repro.experiments.tokenizer_drift import _eos_ids
from repro.proxy import ProxyConfig
from repro.sandbox.local import LocalSandbox, LocalSandboxConfig
from repro.store import open_store
from repro.tasks.distributions import TaskDistributionConfig
from repro.tinymodel.model import TinyModelConfig
from repro.tinymodel.recipe import tiny_model
from tests import support

pytest.importorskip("quicktok", reason="quicktok-v1 missing: pip install -e '.[qwen3-tokenizer]'")

TASKS = TaskDistributionConfig(seed=0, split="test", n_tasks=2, families=["procedural"], operators=["recipe"],
                               difficulty="locate")
HARNESS = MiniSweAgentConfig(step_limit=4)
THINKING_OFF = {"eval": {"chat_template_kwargs": {"enable_thinking": False}}}
MODEL = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                        tokenizer="qwen3")


def breaks_per_rollout(root: Path, chat_template: str) -> tuple[list[dict[str, Any]], list[list[Any]], Any]:
    """:func:`prefix_drift` of each of the expert's rollouts with ``chat_template`` (policy calls), their stored
    calls and the checkpoint's tokenizer."""
    from transformers import AutoTokenizer

    model_dir, _ = tiny_model(TinyModelConfig(**{**MODEL.__dict__, "chat_template": chat_template}), [])
    sandbox = LocalSandbox(LocalSandboxConfig())
    try:
        run = support.run_expert(root, TASKS, HARNESS, sandbox, model_dir=model_dir,
                                 proxy=ProxyConfig(port=0, sampling_overrides=THINKING_OFF))
    finally:
        sandbox.close()
    assert all(r.status == "finished" and r.exit_status == "Submitted" for r in run["results"]), run["results"]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    store = open_store(run["store"])
    try:
        calls = [store.calls(r.rollout_id) for r in store.list_rollouts()]
    finally:
        store.close()
    eos = _eos_ids(tokenizer, model_dir)
    return [prefix_drift([rollout], tokenizer, eos)["policy"] for rollout in calls], calls, tokenizer


@pytest.mark.parametrize("chat_template", ["default", "keep_think"])
def test_prefix_breaks_by_chat_template_with_thinking_off(tmp_path: Path, chat_template: str) -> None:
    drift, calls, tokenizer = breaks_per_rollout(tmp_path, chat_template)
    assert [len(rollout) for rollout in calls] == [3, 3]  # look the line up, edit it, check and submit
    every = [c for rollout in calls for c in rollout]
    assert all(c.sampling_overrides["chat_template_kwargs"] == {"enable_thinking": False} for c in every)
    assert all(tokenizer.decode(c.prompt_ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
               for c in every)  # thinking is off at the server
    assert [d["turns"] for d in drift] == [2, 2] and all(d["flag_disagrees"] == 0 for d in drift)
    if chat_template == "default":  # the history drops the empty think block the model was conditioned on
        assert [(d["breaks"], d["history_changed"]) for d in drift] == [(2, 2), (2, 2)]
    else:
        assert [d["breaks"] for d in drift] == [0, 0]

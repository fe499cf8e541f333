"""Real clients through the real proxy to the real CPU model server: the OpenAI SDK, LiteLLM (as
mini-SWE-agent calls it) and mini-SWE-agent 2.x itself; token ids must match the server's tokenizer."""

from __future__ import annotations

import json
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from transformers import AutoTokenizer

from harness_adapters.mini_swe_agent.adapter import MiniSweAgentConfig, ensure_mini_swe_agent_env, run_mini_swe_agent
from tests.support import RunningProxy, start_proxy

BASH_TOOL = {"type": "function", "function": {
    "name": "bash", "description": "Execute a bash command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
MESSAGES = [{"role": "system", "content": "You are a helpful assistant that can interact with a computer."},
            {"role": "user", "content": "Fix the bug in calc.py: add(2, 3) returns -1."}]


@pytest.fixture(scope="module")
def real_proxy(tmp_path_factory, cpu_server_url: str) -> Iterator[RunningProxy]:
    server, config = start_proxy(tmp_path_factory.mktemp("proxy"), cpu_server_url, upstream_model="tiny-qwen")
    with server:
        yield RunningProxy(server.url, config)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _template_ids(tokenizer, messages: list[dict], tools: list[dict] | None) -> list[int]:
    rendered = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)
    return list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)


def _decoded(tokenizer, ids: list[int]) -> str:
    if ids and ids[-1] == tokenizer.eos_token_id:
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=False)


def test_openai_sdk_token_ids_match_server_tokenizer(real_proxy: RunningProxy, tokenizer) -> None:
    base = real_proxy.new_rollout("sdk")
    client = openai.OpenAI(base_url=base, api_key="sk-x")
    unary = client.chat.completions.create(model="anything", messages=MESSAGES, tools=[BASH_TOOL], max_tokens=24,
                                           temperature=1.0, seed=3)
    chunks = client.chat.completions.create(model="anything", messages=MESSAGES, tools=[BASH_TOOL], max_tokens=24,
                                            temperature=1.0, seed=3, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = real_proxy.store().calls("sdk")
    assert len(calls) == 2
    expected_prompt = _template_ids(tokenizer, MESSAGES, [BASH_TOOL])
    for call, text in zip(calls, [unary.choices[0].message.content or "", streamed], strict=True):
        assert call.status in ("ok", "truncated")
        assert call.prompt_ids == expected_prompt
        assert len(call.completion_ids) == len(call.logprobs) > 0
        assert all(lp <= 0 for lp in call.logprobs)
        if call.finish_reason != "tool_calls":
            assert _decoded(tokenizer, call.completion_ids) == text
    assert calls[0].completion_ids == calls[1].completion_ids  # same seed, streamed or not


LITELLM_SCRIPT = textwrap.dedent("""
    import json, sys
    import litellm
    response = litellm.completion(model="openai/tiny-qwen", api_base=sys.argv[1], api_key="sk-x",
                                  messages=json.loads(sys.argv[2]), tools=[json.loads(sys.argv[3])],
                                  max_tokens=16, drop_params=True, num_retries=0)
    print(json.dumps({"content": response.choices[0].message.content, "model": response.model}))
""")


def test_litellm_as_mini_swe_agent_calls_it(real_proxy: RunningProxy, tokenizer) -> None:
    env = ensure_mini_swe_agent_env()
    base = real_proxy.new_rollout("litellm")
    out = subprocess.run(
        [str(env.python), "-c", LITELLM_SCRIPT, base, json.dumps(MESSAGES), json.dumps(BASH_TOOL)],
        capture_output=True, text=True, timeout=180, env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "PATH": "/usr/bin"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    (call,) = real_proxy.store().calls("litellm")
    assert call.prompt_ids == _template_ids(tokenizer, MESSAGES, [BASH_TOOL])
    assert call.client_headers["user-agent"].startswith("OpenAI/Python")
    if call.finish_reason != "tool_calls":
        assert _decoded(tokenizer, call.completion_ids) == (answer["content"] or "")


def test_real_mini_swe_agent_run_is_fully_recorded(real_proxy: RunningProxy, tmp_path: Path) -> None:
    env = ensure_mini_swe_agent_env()
    base = real_proxy.new_rollout("mini", harness="mini-swe-agent", harness_version="2.4.6")
    workdir = tmp_path / "repo"
    workdir.mkdir()
    (workdir / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    cfg = MiniSweAgentConfig(step_limit=2, max_tokens=32)
    result = run_mini_swe_agent("add(2, 3) returns -1; fix calc.py", workdir, base, "tiny-qwen", cfg,
                                tmp_path / "out", timeout_s=240, env=env)
    assert result.status == "finished", result.reason
    calls = real_proxy.store().calls("mini")
    assert len(calls) == result.n_model_calls >= 1
    assert [c.seq for c in calls] == list(range(len(calls)))
    for call in calls:
        assert call.status in ("ok", "truncated")
        assert call.prompt_ids and call.completion_ids
        assert call.request["tools"][0]["function"]["name"] == "bash"

"""The cached npm installs of Claude Code, Codex CLI and Qwen Code (``harness_adapters.node_cli_env``), each run
once headless against an in-process stub that speaks its API (Anthropic Messages, OpenAI Responses, chat
completions; streamed): exit 0, the stub's text on stdout, and the request it sent (path under a
``/rollouts/<id>`` prefix, streamed, the model name given). First use installs them (~15 s, ~1.1 GB with node 22);
skipped, with the reason, when npm cannot reach its registry and they are not installed yet (fails instead under
``REPRO_REQUIRE_NPM=1``, as in CI)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from harness_adapters.node_cli_env import (
    CLAUDE_CODE,
    CODEX,
    QWEN_CODE,
    NodeCliEnv,
    NodeCliSpec,
)
from repro.testing import StubChatServer
from tests.support import installed_node_cli

MODEL = "repro-stub-model"
ANSWER = "STUB-ANSWER-OK"
PROMPT = "Say hello."
PATHS = {CLAUDE_CODE.name: "/v1/messages?beta=true", CODEX.name: "/v1/responses",
         QWEN_CODE.name: "/v1/chat/completions"}


def _installed(spec: NodeCliSpec) -> NodeCliEnv:
    return installed_node_cli(spec)


def _sse(events: list[tuple[str, dict[str, Any]]]) -> str:
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events)


def _messages_stream(model: str) -> str:
    """An Anthropic Messages stream of one text block."""
    usage = {"input_tokens": 10, "output_tokens": 1}
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": model, "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": usage}
    return _sse([
        ("message_start", {"type": "message_start", "message": message}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": ANSWER}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                           "usage": {"output_tokens": 5}}),
        ("message_stop", {"type": "message_stop"}),
    ])


def _responses_stream(model: str) -> str:
    """An OpenAI Responses stream of one output message."""
    ids = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    part = {"type": "output_text", "text": ANSWER, "annotations": []}
    item = {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant", "content": [part]}
    started = {"id": "resp_1", "object": "response", "created_at": int(time.time()), "model": model,
               "status": "in_progress", "output": []}
    usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15}
    events = [("response.created", {"response": started}),
              ("response.output_item.added", {"output_index": 0, "item": {**item, "content": []}}),
              ("response.output_text.delta", {**ids, "delta": ANSWER}),
              ("response.output_text.done", {**ids, "text": ANSWER}),
              ("response.output_item.done", {"output_index": 0, "item": item}),
              ("response.completed", {"response": {**started, "status": "completed", "output": [item],
                                                   "usage": usage}})]
    return _sse([(name, {"type": name, "sequence_number": i, **data}) for i, (name, data) in enumerate(events)])


def _chat_stream(model: str) -> str:
    """A chat completions stream of one text message, with the usage chunk."""
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    chunks = [{**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ANSWER},
                                    "finish_reason": None}]},
              {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
              {**head, "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}]
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


STREAMS = {CLAUDE_CODE.name: _messages_stream, CODEX.name: _responses_stream, QWEN_CODE.name: _chat_stream}


def _reply(rollout_id: str, body: dict[str, Any]) -> tuple[int, str]:
    """The stream of the API that the CLI named by ``rollout_id`` speaks."""
    return 200, STREAMS[rollout_id](str(body.get("model")))


def _invocation(spec: NodeCliSpec, base: str) -> tuple[list[str], dict[str, str]]:
    """Arguments and extra environment of one headless run against ``base`` (``.../rollouts/<id>``)."""
    if spec is CLAUDE_CODE:
        return (["-p", PROMPT, "--output-format", "json", "--model", MODEL, "--allowedTools", "Bash"],
                {"ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": "dummy", "IS_SANDBOX": "1"})
    if spec is CODEX:
        provider = ["-c", "model_provider=stub", "-c", "model_providers.stub.name=stub",
                    "-c", f"model_providers.stub.base_url={base}/v1", "-c", "model_providers.stub.wire_api=responses",
                    "-c", "model_providers.stub.env_key=OPENAI_API_KEY"]
        return (["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "-m", MODEL,
                 *provider, *spec.quiet_args, PROMPT], {"OPENAI_API_KEY": "dummy"})
    return (["--auth-type", "openai", "--yolo", "-p", PROMPT],
            {"OPENAI_BASE_URL": f"{base}/v1", "OPENAI_API_KEY": "dummy", "OPENAI_MODEL": MODEL})


def _run(env: NodeCliEnv, base: str, root: Path) -> subprocess.CompletedProcess[str]:
    """One run in an empty git repo, with its own HOME (and config / state folders under it), stdin closed."""
    home, work = root / "home", root / "work"
    for folder in (home / ".codex", work, root / "tmp"):
        folder.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    args, extra = _invocation(env.spec, base)
    process_env = {"PATH": env.path(), "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
                   "XDG_CACHE_HOME": str(home / ".cache"), "XDG_DATA_HOME": str(home / ".local" / "share"),
                   "XDG_STATE_HOME": str(home / ".local" / "state"), "CODEX_HOME": str(home / ".codex"),
                   "TMPDIR": str(root / "tmp"), **env.spec.quiet_env, **extra}
    return subprocess.run([str(env.bin), *args], cwd=work, env=process_env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("spec", [CLAUDE_CODE, CODEX, QWEN_CODE], ids=lambda spec: spec.name)
def test_cli_runs_headless_against_a_stub(spec: NodeCliSpec, tmp_path: Path) -> None:
    env = _installed(spec)
    with StubChatServer(_reply) as stub:
        proc = _run(env, f"http://127.0.0.1:{stub.port}/rollouts/{spec.name}", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ANSWER in proc.stdout, proc.stdout[-3000:]
    first = stub.requests[0]
    assert first["path"] == f"/rollouts/{spec.name}{PATHS[spec.name]}"
    assert first["body"]["stream"] is True and first["body"]["model"] == MODEL
    assert all(p.startswith(f"/rollouts/{spec.name}/v1/") for p in stub.paths)

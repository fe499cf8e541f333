"""CPU server: vLLM's OpenAI dialect over a real server process, plus engine and response-building units."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from repro.serving.commands import add_build_model_parser, add_serve_parser
from repro.serving.cpu_server import CPUServerApp
from repro.serving.cpu_server_args import CpuServerArgs
from repro.serving.engine import Engine, EngineConfig, FinishEvent, SamplingParams, TokenEvent
from repro.serving.openai_api import ChoiceOutput, build_chat_choice, parse_common
from repro.serving.sampling import TextTracker
from repro.serving.streaming import ChatStreamer
from repro.serving.vllm_launcher import VLLMConfig, build_vllm_command

MESSAGES = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix calc.py please."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def client(cpu_server_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cpu_server_url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def chat(client: httpx.Client, **body: Any) -> dict[str, Any]:
    resp = client.post("/v1/chat/completions", json={"messages": MESSAGES, **body})
    assert resp.status_code == 200, resp.text
    return resp.json()


def stream_chunks(client: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with client.stream("POST", path, json={**body, "stream": True}) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in resp.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def visible_ids(token_ids: list[int], eos_id: int) -> list[int]:
    return token_ids[:-1] if token_ids and token_ids[-1] == eos_id else token_ids


def test_health_and_models(client: httpx.Client, tiny_model_dir: Path) -> None:
    assert client.get("/health").status_code == 200
    models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == [tiny_model_dir.name]
    assert client.get("/nope").status_code == 404
    assert client.get("/v1/chat/completions").status_code == 405


def test_chat_returns_token_ids_logprobs_and_prompt_ids(client: httpx.Client, tokenizer: Any) -> None:
    out = chat(client, tools=TOOLS, max_tokens=12, seed=7, logprobs=True, top_logprobs=3, return_token_ids=True)
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-")
    expected_prompt = tokenizer.apply_chat_template(
        MESSAGES, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert out["prompt_token_ids"] == expected_prompt
    assert "<tools>" in tokenizer.decode(out["prompt_token_ids"]) and '"name": "bash"' in tokenizer.decode(
        out["prompt_token_ids"]
    )
    (choice,) = out["choices"]
    ids = choice["token_ids"]
    assert 1 <= len(ids) <= 12
    assert choice["finish_reason"] == ("length" if len(ids) == 12 else "stop")
    assert choice["message"]["role"] == "assistant"
    assert tokenizer.decode(visible_ids(ids, tokenizer.eos_token_id), skip_special_tokens=False) == (
        choice["message"]["content"] or ""
    )
    entries = choice["logprobs"]["content"]
    assert len(entries) == len(ids)
    for entry, token_id in zip(entries, ids, strict=True):
        assert entry["token"] == tokenizer.decode([token_id])
        assert entry["bytes"] == list(entry["token"].encode())
        assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 3
        assert entry["top_logprobs"][0]["logprob"] >= entry["logprob"] - 1e-5
    assert out["usage"] == {
        "prompt_tokens": len(expected_prompt),
        "completion_tokens": len(ids),
        "total_tokens": len(expected_prompt) + len(ids),
    }


def test_stream_matches_non_stream_for_same_seed(client: httpx.Client) -> None:
    body = {
        "messages": MESSAGES,
        "max_tokens": 20,
        "seed": 11,
        "temperature": 1.0,
        "return_token_ids": True,
        "logprobs": True,
    }
    full = chat(client, **body)
    chunks = stream_chunks(client, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[0]["prompt_token_ids"] == full["prompt_token_ids"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == full["usage"]
    choice_chunks = [c["choices"][0] for c in chunks[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    ids = [t for c in choice_chunks for t in c["token_ids"]]
    content = "".join(c["delta"].get("content") or "" for c in choice_chunks)
    logprobs = [e for c in choice_chunks if c["logprobs"] for e in c["logprobs"]["content"]]
    (expected,) = full["choices"]
    assert ids == expected["token_ids"]
    assert content == expected["message"]["content"]
    assert logprobs == expected["logprobs"]["content"]
    assert [c["finish_reason"] for c in choice_chunks][-1] == expected["finish_reason"]
    assert all(c["finish_reason"] is None for c in choice_chunks[:-1])


def test_greedy_is_deterministic_and_n_gives_choices(client: httpx.Client) -> None:
    first = chat(client, temperature=0, max_tokens=8, return_token_ids=True)
    second = chat(client, temperature=0, max_tokens=8, n=2, return_token_ids=True)
    assert [c["index"] for c in second["choices"]] == [0, 1]
    assert second["choices"][0]["token_ids"] == second["choices"][1]["token_ids"] == first["choices"][0]["token_ids"]
    nucleus = chat(client, top_p=1e-6, max_tokens=8, seed=1, return_token_ids=True)  # keeps only the top token
    assert nucleus["choices"][0]["token_ids"] == first["choices"][0]["token_ids"]
    sampled = chat(client, max_tokens=16, n=2, seed=5, return_token_ids=True)
    assert sampled["choices"][0]["token_ids"] != sampled["choices"][1]["token_ids"]
    assert sampled["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in sampled["choices"])


def test_stop_string_cuts_text_and_generation(client: httpx.Client, tokenizer: Any) -> None:
    body = {"max_tokens": 40, "seed": 3, "return_token_ids": True}
    free = chat(client, **body)["choices"][0]
    text = free["message"]["content"]
    pieces = [tokenizer.decode([t]) for t in free["token_ids"]]
    # a stop string that spans two tokens: the engine must hold text back until it can tell
    stop = next(
        a[-1] + b[0]
        for a, b in itertools.pairwise(pieces[1:])
        if a and b and (a[-1] + b[0]).isascii() and (a[-1] + b[0]).strip() and text.count(a[-1] + b[0])
    )
    cut = chat(client, **body, stop=["never-appears", stop])["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["stop_reason"] == stop
    assert cut["message"]["content"] == text[: text.index(stop)]
    assert cut["token_ids"] == free["token_ids"][: len(cut["token_ids"])]
    assert stop in tokenizer.decode(cut["token_ids"]) and len(cut["token_ids"]) < len(free["token_ids"])
    chunks = stream_chunks(client, "/v1/chat/completions", {"messages": MESSAGES, **body, "stop": stop})
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == cut["message"]["content"]


def test_stop_token_ids_end_with_that_token(client: httpx.Client, tokenizer: Any) -> None:
    body = {"max_tokens": 30, "seed": 4, "return_token_ids": True}
    free = chat(client, **body)["choices"][0]
    stop_id = free["token_ids"][5]
    first = free["token_ids"].index(stop_id)
    cut = chat(client, **body, stop_token_ids=[stop_id])["choices"][0]
    assert cut["token_ids"] == free["token_ids"][: first + 1]  # the stop token is returned, like eos
    assert cut["finish_reason"] == "stop" and cut["stop_reason"] == stop_id
    assert cut["message"]["content"] == tokenizer.decode(cut["token_ids"][:-1])


@pytest.mark.parametrize(
    "body",
    [
        {"messages": "hello"},
        {"messages": []},
        {"messages": [{"content": "no role"}]},
        {"messages": MESSAGES, "temperature": "hot"},
        {"messages": MESSAGES, "max_tokens": "many"},
        {"messages": MESSAGES, "max_tokens": 0},
        {"messages": MESSAGES, "n": 0},
        {"messages": MESSAGES, "stop": 5},
        {"messages": MESSAGES, "logprobs": "yes"},
        {"messages": MESSAGES, "top_logprobs": 2},
        {"messages": MESSAGES, "logprobs": True, "top_logprobs": 1000},
        {"messages": MESSAGES, "stream": "yes"},
        {"messages": MESSAGES, "seed": True},
        {"messages": MESSAGES, "max_tokens": 10**6},
        [1, 2],
    ],
)
def test_bad_chat_requests_get_400(client: httpx.Client, body: Any) -> None:
    resp = client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["type"] == "invalid_request_error"


def test_malformed_json_and_unknown_model(client: httpx.Client) -> None:
    for path in ("/v1/chat/completions", "/v1/completions"):
        resp = client.post(path, content=b'{"messages": [', headers={"content-type": "application/json"})
        assert resp.status_code == 400 and resp.json()["error"]["type"] == "invalid_request_error"
    resp = client.post("/v1/chat/completions", json={"messages": MESSAGES, "model": "other"})
    assert resp.status_code == 404


def test_completions_with_token_id_prompt(client: httpx.Client, tokenizer: Any) -> None:
    prompt = tokenizer.encode("def add(a, b):\n", add_special_tokens=False)
    body = {"prompt": prompt, "max_tokens": 10, "seed": 1, "return_token_ids": True, "logprobs": 2}
    out = client.post("/v1/completions", json=body).json()
    (choice,) = out["choices"]
    assert out["object"] == "text_completion" and choice["prompt_token_ids"] == prompt
    assert tokenizer.decode(visible_ids(choice["token_ids"], tokenizer.eos_token_id)) == choice["text"]
    assert len(choice["logprobs"]["tokens"]) == len(choice["token_ids"]) == len(choice["logprobs"]["token_logprobs"])
    chunks = stream_chunks(client, "/v1/completions", body)
    assert chunks[0]["choices"][0]["prompt_token_ids"] == prompt
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == choice["token_ids"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]
    default_len = client.post("/v1/completions", json={"prompt": "x", "temperature": 0, "stop_token_ids": []}).json()
    assert default_len["usage"]["completion_tokens"] <= 16  # legacy completions default max_tokens


def test_concurrent_requests_are_all_answered(cpu_server_url: str) -> None:
    async def run() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=cpu_server_url, timeout=60) as c:
            responses = await asyncio.gather(
                *[
                    c.post(
                        "/v1/chat/completions",
                        json={"messages": MESSAGES, "max_tokens": 16, "seed": i, "return_token_ids": True},
                    )
                    for i in range(8)
                ]
            )
        return [r.json() for r in responses]

    results = asyncio.run(run())
    assert len(results) == 8 and all(len(r["choices"][0]["token_ids"]) >= 1 for r in results)
    alone = chat(httpx.Client(base_url=cpu_server_url, timeout=60), max_tokens=16, seed=3, return_token_ids=True)
    assert alone["choices"][0]["token_ids"] == results[3]["choices"][0]["token_ids"]


def test_openai_client_works(cpu_server_url: str) -> None:
    openai = pytest.importorskip("openai")
    c = openai.OpenAI(base_url=cpu_server_url + "/v1", api_key="unused")
    resp = c.chat.completions.create(
        model=c.models.list().data[0].id, messages=MESSAGES, max_tokens=5, extra_body={"return_token_ids": True}
    )
    assert resp.choices[0].model_extra["token_ids"]
    stream = c.chat.completions.create(
        model=resp.model, messages=MESSAGES, max_tokens=5, stream=True, stream_options={"include_usage": True}
    )
    assert list(stream)[-1].usage.completion_tokens >= 1


# ---- response building (the tiny random model never emits tool calls) ----


def _token_text(token_id: int) -> str:
    return f"<{token_id}>"


def test_tool_call_text_becomes_tool_calls() -> None:
    text = 'Running it.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    out = ChoiceOutput(token_ids=[1, 2], logprobs=[-0.5, -1.0], top_logprobs=[[], []], text=text, finish_reason="stop")
    choice = build_chat_choice(0, out, parse_tools=True, logprobs=True, return_token_ids=True, token_text=_token_text)
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Running it.\n"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "bash", "arguments": '{"command": "ls"}'} and call["type"] == "function"
    assert choice["token_ids"] == [1, 2] and [e["token"] for e in choice["logprobs"]["content"]] == ["<1>", "<2>"]
    plain = build_chat_choice(0, out, parse_tools=False, logprobs=False, return_token_ids=False, token_text=_token_text)
    assert plain["message"] == {"role": "assistant", "content": text} and plain["finish_reason"] == "stop"
    assert "token_ids" not in plain and plain["logprobs"] is None


def test_streamed_tool_call_chunks() -> None:
    common = parse_common({"return_token_ids": True}, SamplingParams(), 20, chat=True)
    pieces = ["ok ", "<tool_call>", '\n{"name": "bash", ', '"arguments": {"command": "ls"}}\n', "</tool_call>"]

    async def events() -> Any:
        for i, piece in enumerate(pieces):
            yield 0, TokenEvent(i, -1.0, None, piece)
        yield 0, TokenEvent(99, -1.0, None, "")
        yield 0, FinishEvent("stop", None, "")

    async def collect() -> list[dict[str, Any]]:
        streamer = ChatStreamer(common, "m", [5, 6], True, _token_text)
        return [chunk async for chunk in streamer.run(events())]

    chunks = asyncio.run(collect())
    choices = [c["choices"][0] for c in chunks]
    assert [t for c in choices for t in c["token_ids"]] == [*range(len(pieces)), 99]
    assert "".join(c["delta"].get("content") or "" for c in choices) == "ok "
    calls = [t for c in choices for t in c["delta"].get("tool_calls", [])]
    assert [(t["index"], t["function"]["name"]) for t in calls] == [(0, "bash")]
    assert choices[-1]["finish_reason"] == "tool_calls"


# ---- engine (in this process) ----


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[Engine]:
    eng = Engine(EngineConfig(model_dir=tiny_model_dir, max_batch_size=4, max_model_len=128))
    yield eng
    eng.close()


def test_engine_cancel_stops_the_row(engine: Engine) -> None:
    async def run() -> tuple[int, FinishEvent]:
        out: asyncio.Queue = asyncio.Queue()
        req = engine.submit([1, 2, 3], SamplingParams(max_tokens=60, stop_token_ids=[], seed=0), out)
        n_tokens = 0
        while True:
            _, event = await asyncio.wait_for(out.get(), 10)
            if isinstance(event, TokenEvent):
                n_tokens += 1
                if n_tokens == 3:
                    req.cancelled.set()
            else:
                return n_tokens, event

    n_tokens, finish = asyncio.run(run())
    assert finish.reason in ("abort", "stop") and n_tokens < 60
    if finish.reason == "stop":  # the model happened to emit eos first
        assert n_tokens <= 3


def test_engine_generate_iterates_one_row(engine: Engine) -> None:
    async def run() -> list[Any]:
        return [event async for event in engine.generate([1, 2, 3], SamplingParams(temperature=0, max_tokens=5))]

    events = asyncio.run(run())
    assert isinstance(events[-1], FinishEvent) and all(isinstance(e, TokenEvent) for e in events[:-1])
    assert (len(events) - 1, events[-1].reason) in ((5, "length"), *((k, "stop") for k in range(1, 5)))
    assert [e.token_id for e in events[:-1]] == [e.token_id for e in asyncio.run(run())[:-1]]


def test_serve_flags_build_the_server_config(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    add_serve_parser(sub)
    add_build_model_parser(sub)
    args = parser.parse_args(["serve", "--model", str(tmp_path), "--port", "9001", "--max-batch-size", "3"])
    config = CpuServerArgs.from_args(args).server_config()
    assert (config.host, config.port, config.engine.max_batch_size, config.engine.model_dir) == (
        "127.0.0.1",
        9001,
        3,
        tmp_path,
    )


def parse_server_flags(argv: list[str]) -> CpuServerArgs:
    parser = argparse.ArgumentParser()
    CpuServerArgs.add_arguments(parser)
    return CpuServerArgs.from_args(parser.parse_args(argv))


def test_server_args_round_trip_through_their_argv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REPRO_SERVER_API_KEY", raising=False)
    changed = CpuServerArgs(model=tmp_path, host="0.0.0.0", port=9002, served_model_name="m", max_batch_size=3,
                            batch_window_ms=2.5, torch_threads=2, default_max_tokens=64, max_model_len=4096,
                            max_logprobs=5, log_level="info", expert_tasks=tmp_path / "t.jsonl", expert_slip_rate=0.4,
                            expert_slip_seed=7, expert_slip_operators=("flip", "off_by_one"),
                            scenarios=tmp_path / "s.json", prefix_cache_tokens=1024)
    defaults = [f.name for f in dataclasses.fields(CpuServerArgs) if getattr(changed, f.name) == f.default]
    assert defaults == ["api_key"]  # every other field differs from its default, so each flag is exercised
    assert parse_server_flags(changed.to_argv()) == changed
    assert CpuServerArgs(model=tmp_path).to_argv() == ["--model", str(tmp_path)]
    assert parse_server_flags(["--model", str(tmp_path)]) == CpuServerArgs(model=tmp_path)


def test_the_api_key_goes_through_the_environment_not_the_argv(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    keyed = CpuServerArgs(model=tmp_path, api_key="sk-secret")
    assert "sk-secret" not in keyed.to_argv() and "sk-secret" not in repr(keyed)
    assert keyed.env() == {"REPRO_SERVER_API_KEY": "sk-secret"}
    monkeypatch.setenv("REPRO_SERVER_API_KEY", "sk-secret")
    assert parse_server_flags(keyed.to_argv()) == keyed
    assert keyed.server_config().api_key == "sk-secret"


def test_engine_rejects_prompt_over_context(engine: Engine) -> None:
    from repro.serving.engine import PromptTooLongError

    with pytest.raises(PromptTooLongError, match="maximum context length"):
        engine.resolve_max_tokens(120, 10)
    with pytest.raises(PromptTooLongError):
        engine.resolve_max_tokens(128, None)
    assert engine.resolve_max_tokens(124, None) == 4


_TRACKER_TEXT = st.lists(st.sampled_from([*"ab \n", "é", "€", "😀", "<tool_call>"]), max_size=30).map("".join)


@settings(max_examples=80, deadline=None)
@given(
    text=_TRACKER_TEXT,
    noise=st.lists(st.integers(min_value=0, max_value=515), max_size=4),
    stop=st.lists(st.text(alphabet="ab \né", min_size=1, max_size=3), max_size=2),
)
def test_text_tracker_releases_decode_cut_at_stop(engine: Engine, text: str, noise: list[int], stop: list[str]) -> None:
    """Multi-byte characters split over byte tokens and stop strings split over tokens are handled."""
    ids = engine.tokenizer.encode(text, add_special_tokens=False) + noise
    tracker = TextTracker(engine._decoder, stop)
    released, hit = "", None
    for token_id in ids:
        piece, hit = tracker.add(token_id)
        assert "\ufffd" not in piece or "\ufffd" in engine.tokenizer.decode(noise)
        released += piece
        if hit is not None:
            break
    if hit is None:
        released += tracker.flush()
    full = engine.tokenizer.decode(ids, skip_special_tokens=False)
    matches = [full.find(s) for s in stop if s in full]
    assert released == (full[: min(matches)] if matches else full)


def test_client_disconnect_cancels_the_stream(engine: Engine) -> None:
    app = CPUServerApp(engine, "m")
    submitted: list[Any] = []
    real_submit = engine.submit

    def spy(*args: Any, **kwargs: Any) -> Any:
        submitted.append(real_submit(*args, **kwargs))
        return submitted[-1]

    async def run() -> list[dict[str, Any]]:
        gone = asyncio.Event()
        sent: list[dict[str, Any]] = []
        body = {"messages": MESSAGES, "max_tokens": 80, "stream": True, "seed": 0}
        messages = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if len(sent) == 3:
                gone.set()

        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
        await asyncio.wait_for(app(scope, receive, send), 10)
        return sent

    engine.submit = spy  # type: ignore[method-assign]
    try:
        sent = asyncio.run(run())
    finally:
        engine.submit = real_submit  # type: ignore[method-assign]
    assert sent[0]["status"] == 200
    joined = b"".join(m.get("body", b"") for m in sent)
    assert len(sent) < 12 and b"[DONE]" not in joined and b'"finish_reason":"' not in joined
    assert len(submitted) == 1 and submitted[0].cancelled.is_set()


def test_vllm_command() -> None:
    cmd = build_vllm_command(VLLMConfig(model="/ckpt", port=8011, served_model_name="m", seed=3, max_logprobs=5))
    assert cmd[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "/ckpt"]
    joined = " ".join(cmd)
    for part in (
        "--host 127.0.0.1",
        "--port 8011",
        "--served-model-name m",
        "--enable-auto-tool-choice",
        "--tool-call-parser hermes",
        "--max-logprobs 5",
        "--seed 3",
    ):
        assert part in joined


def test_scenario_script_answers_by_marker_and_turn(tmp_path: Path) -> None:
    from repro.serving.scripted import scenario_script

    path = tmp_path / "scenarios.json"
    path.write_text('{"a": ["first", "second"]}')
    reply = scenario_script(path)
    one_turn = "<|im_start|>user\nSCENARIO a. fix it"
    assert reply(one_turn) == "first"
    assert reply(one_turn + "<|im_start|>user\nok" * 2) == "second"  # the last reply repeats
    assert reply("<|im_start|>user\nno marker") == ""

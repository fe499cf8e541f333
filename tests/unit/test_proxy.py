"""The recording proxy against a fake vLLM-dialect upstream: recording, bad input, upstream faults."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import httpx
import openai
import pytest

from repro.common.net import free_port
from repro.common.seeding import call_seed
from repro.proxy.config import replica_index
from repro.testing import FakeVllmUpstream, ServerThread, fake_completion_text, fake_prompt_ids
from tests.support import RunningProxy, start_proxy

_BASH_PARAMS = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a command", "parameters": _BASH_PARAMS}}]


def _chat(proxy_url: str, **kwargs) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **kwargs}
    return httpx.post(f"{proxy_url}/chat/completions", json=body, timeout=10)


def test_openai_sdk_unary_and_stream_are_recorded(proxy: RunningProxy) -> None:
    base = proxy.new_rollout("r1", task_id="t1")
    client = openai.OpenAI(base_url=base, api_key="sk-test")
    messages = [{"role": "user", "content": "list files"}]
    out = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    assert out.choices[0].message.content == fake_completion_text({"messages": messages}, 16)
    stream = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True,
                                            stream_options={"include_usage": True})
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == out.choices[0].message.content
    calls = proxy.store().calls("r1")
    assert [c.seq for c in calls] == [0, 1]
    assert [c.streamed for c in calls] == [False, True]
    for call in calls:
        assert call.status == "ok"
        assert call.prompt_ids == fake_prompt_ids({"messages": messages})
        assert bytes(call.completion_ids).decode() == out.choices[0].message.content
        assert call.logprobs == [-0.5] * 16
        assert call.request["tools"] == TOOLS
        assert call.retry_count == 0
    assert calls[1].response["choices"][0]["message"]["content"] == streamed


def test_text_completions_with_token_id_prompt(proxy: RunningProxy) -> None:
    base = proxy.new_rollout("r2")
    resp = httpx.post(f"{base}/completions", json={"model": "m", "prompt": [5, 6, 7], "max_tokens": 4})
    assert resp.status_code == 200, resp.text
    (call,) = proxy.store().calls("r2")
    assert call.endpoint == "completions"
    assert call.prompt_ids == [5, 6, 7]
    assert len(call.completion_ids) == 4
    assert call.status == "truncated" and call.finish_reason == "length"


def test_upstream_receives_forced_token_ids_logprobs_and_mode_overrides(tmp_path, fake_upstream) -> None:
    app, upstream_url = fake_upstream
    server, config = start_proxy(tmp_path, upstream_url, upstream_model="served",
                                 sampling_overrides={"train": {"temperature": 1.0, "top_p": 1.0}})
    with server:
        running = RunningProxy(server.url, config)
        base = running.new_rollout("tr", mode="train")
        assert _chat(base, temperature=0.2).status_code == 200
        sent = app.last_request
        assert sent["return_token_ids"] is True and sent["logprobs"] is True
        assert sent["temperature"] == 1.0 and sent["model"] == "served"
        (call,) = running.store().calls("tr")
        assert call.request["temperature"] == 0.2  # what the harness asked for
        assert call.sampling_overrides == {"temperature": 1.0, "top_p": 1.0}


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (json.dumps({"messages": "hi"}).encode(), "'messages'"),
        (json.dumps({"messages": [{"content": "x"}]}).encode(), "role"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}).encode(), "temperature"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}).encode(), "stream"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5}).encode(), "max_tokens"),
    ],
)
def test_malformed_request_is_400_and_writes_nothing(proxy: RunningProxy, body: bytes, fragment: str) -> None:
    base = proxy.new_rollout("bad")
    resp = httpx.post(f"{base}/chat/completions", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 400
    assert fragment in resp.json()["error"]["message"]
    assert proxy.store().count_calls() == 0


def test_unknown_rollout_is_404_and_bad_rollout_id_is_400(proxy: RunningProxy) -> None:
    resp = _chat(proxy.client.base_url("never-made"))  # the right capability, but nothing registered
    assert resp.status_code == 404 and "unknown rollout" in resp.json()["error"]["message"]
    for bad in ("a.b", "x" * 129, "sp%20ace"):
        resp = _chat(f"{proxy.url}/rollouts/{bad}/v1")
        assert resp.status_code == 400, bad
    assert proxy.store().count_calls() == 0


def test_body_over_limit_is_413(tmp_path, fake_upstream) -> None:
    server, config = start_proxy(tmp_path, fake_upstream[1], max_body_bytes=1000)
    with server:
        running = RunningProxy(server.url, config)
        base = running.new_rollout("big")
        resp = _chat(base, messages=[{"role": "user", "content": "x" * 2000}])
        assert resp.status_code == 413 and "max_body_bytes" in resp.json()["error"]["message"]
        assert running.store().count_calls() == 0


def test_upstream_down_is_502_with_error_record(tmp_path) -> None:
    from repro.common.net import free_port

    server, config = start_proxy(tmp_path, f"http://127.0.0.1:{free_port()}", connect_timeout_s=1.0)
    with server:
        running = RunningProxy(server.url, config)
        base = running.new_rollout("down")
        resp = _chat(base)
        assert resp.status_code == 502 and "unreachable" in resp.json()["error"]["message"]
        (call,) = running.store().calls("down")
        assert call.status == "error" and "unreachable" in call.error


def test_upstream_5xx_is_502_with_error_record(proxy: RunningProxy) -> None:
    base = proxy.new_rollout("five")
    resp = _chat(base, model="fail-500")
    assert resp.status_code == 502
    (call,) = proxy.store().calls("five")
    assert call.status == "error" and call.http_status == 500 and "fake upstream failure" in call.error


def test_silent_upstream_is_504_not_a_hang(tmp_path, fake_upstream) -> None:
    server, config = start_proxy(tmp_path, fake_upstream[1], read_timeout_s=0.5)
    with server:
        running = RunningProxy(server.url, config)
        base = running.new_rollout("quiet")
        started = time.monotonic()
        resp = _chat(base, model="silent")
        assert resp.status_code == 504
        assert time.monotonic() - started < 8
        (call,) = running.store().calls("quiet")
        assert call.status == "error" and "sent nothing" in call.error


def test_stream_cut_by_upstream_is_an_error_record(proxy: RunningProxy) -> None:
    base = proxy.new_rollout("cut")
    with httpx.stream("POST", f"{base}/chat/completions", json={
        "model": "drop", "messages": [{"role": "user", "content": "x"}], "stream": True}) as resp:
        text = resp.read().decode()
    assert "[DONE]" not in text and '"error"' in text
    (call,) = proxy.store().calls("cut")
    assert call.status == "error"
    assert 0 < len(call.completion_ids) < 16  # the partial tokens are kept


def test_client_disconnect_mid_stream_aborts_and_cancels_upstream(proxy: RunningProxy, fake_upstream) -> None:
    app, _ = fake_upstream
    cancelled_before = app.cancelled
    base = proxy.new_rollout("gone")
    with httpx.stream("POST", f"{base}/chat/completions", json={
        "model": "slow-stream", "messages": [{"role": "user", "content": "x"}], "stream": True}) as resp:
        chunks = resp.iter_bytes()
        next(chunks)
        next(chunks)
    deadline = time.monotonic() + 10
    calls = []
    while time.monotonic() < deadline and not calls:
        calls = proxy.store().calls("gone")
        time.sleep(0.05)
    (call,) = calls
    assert call.status == "aborted"
    assert 0 < len(call.completion_ids) < 16
    while time.monotonic() < deadline and app.cancelled == cancelled_before:
        time.sleep(0.05)
    assert app.cancelled == cancelled_before + 1


def test_secrets_are_never_stored(proxy: RunningProxy) -> None:
    base = proxy.new_rollout("sec")
    secret = "sk-SUPERSECRET-123"
    resp = httpx.post(f"{base}/chat/completions", headers={"Authorization": f"Bearer {secret}"},
                      json={"model": "m", "messages": [{"role": "user", "content": "x"}], "api_key": secret})
    assert resp.status_code == 200
    (call,) = proxy.store().calls("sec")
    assert "authorization" not in call.client_headers and "api_key" not in call.request
    for suffix in ("", "-wal"):
        path = Path(proxy.config.store_path + suffix)
        if path.exists():
            assert secret.encode() not in path.read_bytes()


def test_rollout_finish_and_info(proxy: RunningProxy) -> None:
    base = proxy.new_rollout("fin", task_id="t9")
    assert _chat(base).status_code == 200
    control = proxy.client.headers
    resp = httpx.post(f"{proxy.url}/rollouts/fin/finish", json={"status": "finished", "reward": 1.0},
                      headers=control)
    assert resp.status_code == 200 and resp.json()["calls"] == 1
    rollout = proxy.store().get_rollout("fin")
    assert rollout.status == "finished" and rollout.reward == 1.0 and rollout.task_id == "t9"
    assert httpx.post(f"{proxy.url}/rollouts/fin/finish", json={"status": "weird"}, headers=control).status_code \
        == 400
    assert httpx.post(f"{proxy.url}/rollouts", json={"rollout_id": "fin"}, headers=control).status_code == 409


def test_upstream_silent_mid_stream_ends_the_stream_with_an_error(tmp_path, fake_upstream) -> None:
    server, config = start_proxy(tmp_path, fake_upstream[1], read_timeout_s=0.02)
    with server:
        running = RunningProxy(server.url, config)
        base = running.new_rollout("stall")
        started = time.monotonic()
        with httpx.stream("POST", f"{base}/chat/completions", json={
                "model": "slow-stream", "messages": [{"role": "user", "content": "x"}], "stream": True}) as resp:
            text = resp.read().decode()
        assert time.monotonic() - started < 5
        assert "[DONE]" not in text and "sent nothing" in text
        (call,) = running.store().calls("stall")
        assert call.status == "error" and "sent nothing" in call.error


def test_models_and_health_routes(proxy: RunningProxy) -> None:
    base = proxy.new_rollout("m1")
    assert httpx.get(f"{proxy.url}/health").json()["status"] == "ok"
    for url in (f"{proxy.url}/v1/models", f"{base}/models"):
        resp = httpx.get(url)
        assert resp.status_code == 200 and resp.json()["data"][0]["id"] == "fake"
    resp = httpx.post(f"{proxy.url}/v1/chat/completions", json={})
    assert resp.status_code == 404 and "/rollouts/" in resp.json()["error"]["message"]
    assert proxy.store().count_calls() == 0


def test_rollout_sampling_metadata_overrides_the_mode(tmp_path, fake_upstream) -> None:
    app, upstream_url = fake_upstream
    server, config = start_proxy(tmp_path, upstream_url, sampling_overrides={"eval": {"temperature": 0.0, "seed": 1}})
    with server:
        running = RunningProxy(server.url, config)
        base = running.client.register(rollout_id="s3", metadata={"sampling": {"seed": 3}})
        assert _chat(base, temperature=0.7, seed=99).status_code == 200
        # the rollout's seed, not the mode's nor the harness's, derived per call (repro.common.seeding.call_seed)
        assert app.last_request["seed"] == call_seed(3, 0) and app.last_request["temperature"] == 0.0
        (call,) = running.store().calls("s3")
        assert call.sampling_overrides == {"temperature": 0.0, "seed": call_seed(3, 0)}
        bad = httpx.post(f"{running.url}/rollouts", json={"rollout_id": "s4", "metadata": {"sampling": 5}},
                         headers=running.client.headers)
        assert bad.status_code == 400 and running.store().get_rollout("s4") is None


def test_purpose_route_records_side_calls_and_refuses_unknown_purposes(proxy: RunningProxy) -> None:
    from repro.proxy import purpose_base_url

    base = proxy.new_rollout("rp")
    aux = purpose_base_url(base, "auxiliary")
    assert aux == base.removesuffix("/v1") + "/purpose/auxiliary/v1"
    assert _chat(base).status_code == 200
    assert _chat(aux, stream=True).status_code == 200
    assert _chat(purpose_base_url(base, "summary")).status_code == 200
    bad = _chat(base.removesuffix("/v1") + "/purpose/title/v1")
    assert bad.status_code == 404 and "unknown call purpose 'title'" in bad.text
    calls = proxy.store().calls("rp")
    assert [(c.seq, c.purpose, c.streamed) for c in calls] == [(0, "policy", False), (1, "auxiliary", True),
                                                               (2, "summary", False)]
    assert all(c.prompt_ids and c.completion_ids for c in calls)
    with pytest.raises(ValueError, match="not a rollout base URL"):
        purpose_base_url("http://x/v1", "auxiliary")


def test_each_rollout_stays_on_one_replica_chosen_from_its_id(tmp_path) -> None:
    """verl's vLLM replicas behind one proxy: all calls of a rollout reach the replica ``replica_index`` names
    (its prefix cache), rollouts spread over replicas; one replica down fails only the rollouts pinned to it."""
    apps = [FakeVllmUpstream(completion_tokens=4) for _ in range(3)]
    with ServerThread(apps[0], free_port()) as a, ServerThread(apps[1], free_port()) as b, \
            ServerThread(apps[2], free_port()) as c:
        server, config = start_proxy(tmp_path, a.url, upstream_replicas=[b.url, c.url])
        with server:
            running = RunningProxy(server.url, config)
            rollouts = [f"rollout-{i}" for i in range(12)]
            for rollout in rollouts:
                base = running.new_rollout(rollout)
                before = [app.requests for app in apps]
                for _ in range(3):
                    assert _chat(base).status_code == 200
                grew = [app.requests - was for app, was in zip(apps, before, strict=True)]
                assert grew == [3 if i == replica_index(rollout, 3) else 0 for i in range(3)], rollout
            assert all(app.requests > 0 for app in apps)  # sha256 spreads 12 rollouts over all 3
        down = [r for r in rollouts if replica_index(r, 2) == 1]
        server, config = start_proxy(tmp_path / "down", a.url, upstream_replicas=[f"http://127.0.0.1:{free_port()}"])
        with server:
            running = RunningProxy(server.url, config)
            for rollout in rollouts:
                resp = _chat(running.new_rollout(rollout))
                assert resp.status_code == (502 if rollout in down else 200), rollout
                if rollout in down:
                    assert "unreachable" in resp.text


def test_replica_index_is_stable_and_spreads_rollouts() -> None:
    assert replica_index("any", 1) == 0 and replica_index("any", 0) == 0
    assert replica_index("r7", 4) == int(hashlib.sha256(b"r7").hexdigest()[:16], 16) % 4  # not the salted hash()
    picks = [replica_index(f"r{i}", 4) for i in range(400)]
    assert set(picks) == {0, 1, 2, 3} and min(picks.count(p) for p in range(4)) > 60

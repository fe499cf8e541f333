"""A misbehaving upstream never stops the proxy: each fault is a recorded upstream error, the next calls work."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from repro.testing import UPSTREAM_FAULTS
from tests.support import RunningProxy, start_proxy

pytestmark = pytest.mark.timeout(120)
_MESSAGES = [{"role": "user", "content": "x"}]
_TIMEOUT = httpx.Timeout(10.0)


def _chat(base: str, model: str = "m", stream: bool = False) -> tuple[int, str]:
    body = {"model": model, "messages": _MESSAGES, "stream": stream}
    with httpx.stream("POST", f"{base}/chat/completions", json=body, timeout=_TIMEOUT) as resp:
        return resp.status_code, resp.read().decode()


def assert_next_calls_work(proxy: RunningProxy, rollout_id: str, base: str, n: int = 10) -> None:
    """``n`` normal calls (unary and streaming in turn) succeed and are stored after what came before."""
    before = len(proxy.store().calls(rollout_id))
    for i in range(n):
        status, text = _chat(base, stream=i % 2 == 1)
        assert status == 200, text
        if i % 2:
            assert text.rstrip().endswith("data: [DONE]")
    calls = proxy.store().calls(rollout_id)
    assert [c.seq for c in calls] == list(range(before + n))  # no gap: every call was recorded
    assert all(c.status == "ok" and len(c.completion_ids) == 16 and c.logprobs == [-0.5] * 16 for c in calls[before:])


VALUE_FAULTS = [("null-logprob", "logprob None"), ("huge-id", "2147483648"),
                ("nan-logprob", "unreadable"), ("inf-logprob", "unreadable")]


@pytest.mark.parametrize(("fault", "fragment"), VALUE_FAULTS)
def test_unary_value_fault_is_a_recorded_upstream_error(proxy: RunningProxy, fault: str, fragment: str) -> None:
    base = proxy.new_rollout("v")
    status, text = _chat(base, model=fault)
    assert status == 502 and fragment in text, text
    (call,) = proxy.store().calls("v")
    assert call.status == "error" and fragment in call.error
    assert call.completion_ids is None and call.logprobs is None  # nothing stored that the trainer could misread
    assert_next_calls_work(proxy, "v", base)


@pytest.mark.parametrize(("fault", "fragment"), [
    ("null-logprob", "logprob None"), ("huge-id", "2147483648"), ("nan-logprob", "unreadable event"),
    ("inf-logprob", "unreadable event"), ("sse-array", "not a JSON object"), ("sse-truncated", "unreadable event"),
    ("sse-truncated-end", "ended before data: [DONE]"), ("error-event", "fake engine failure"),
])
def test_stream_fault_ends_with_an_error_event_and_a_record(proxy: RunningProxy, fault: str, fragment: str) -> None:
    assert fault in UPSTREAM_FAULTS
    base = proxy.new_rollout("s")
    status, text = _chat(base, model=fault, stream=True)
    assert status == 200  # the stream had started: the fault arrives as its last event
    events = [line[len("data: "):] for line in text.split("\n\n") if line]
    assert "[DONE]" not in events and fragment in text, text
    assert all(isinstance(json.loads(e), dict) for e in events)  # never half an event, never the bad one
    assert "error" in json.loads(events[-1])
    (call,) = proxy.store().calls("s")
    assert call.status == "error" and fragment in call.error, call.error
    assert_next_calls_work(proxy, "s", base)


def test_completions_null_logprob_is_refused_but_echoed_prompt_logprobs_are_cut_off(proxy: RunningProxy) -> None:
    base = proxy.new_rollout("c")
    bad = httpx.post(f"{base}/completions", json={"model": "null-logprob", "prompt": "abcdefgh", "max_tokens": 32},
                     timeout=_TIMEOUT)
    assert bad.status_code == 502 and "logprob None" in bad.json()["error"]["message"]
    echo = httpx.post(f"{base}/completions", json={"model": "m", "prompt": "abcdefgh", "max_tokens": 32, "echo": True},
                      timeout=_TIMEOUT)
    assert echo.status_code == 200, echo.text
    assert echo.json()["choices"][0]["logprobs"]["token_logprobs"][0] is None  # the client gets vLLM's body as is
    refused, echoed = proxy.store().calls("c")
    assert refused.status == "error"
    assert echoed.status == "ok" and echoed.prompt_ids == [ord("a"), ord("e")]
    assert echoed.logprobs == [-0.5] * 16 and len(echoed.completion_ids) == 16  # aligned with the sampled tokens
    assert_next_calls_work(proxy, "c", base)


def test_ids_outside_the_vocabulary_are_refused(tmp_path, fake_upstream) -> None:
    server, config = start_proxy(tmp_path, fake_upstream[1], vocab_size=100)  # the fake's ids are bytes: 'x' = 120
    with server:
        running = RunningProxy(server.url, config)
        base = running.new_rollout("vocab")
        status, text = _chat(base)
        assert status == 502 and "vocabulary of 100 tokens" in text
        status, text = _chat(base, stream=True)
        assert status == 200 and "vocabulary of 100 tokens" in text and not text.rstrip().endswith("[DONE]")
        calls = running.store().calls("vocab")
        assert [c.status for c in calls] == ["error", "error"] and all("proxy.vocab_size" in c.error for c in calls)
        assert all(c.completion_ids is None for c in calls)


def test_writer_that_stops_turns_health_red_and_answers_503_at_once(tmp_path, fake_upstream, monkeypatch) -> None:
    from repro.store.writer import GroupCommitWriter

    server, config = start_proxy(tmp_path, fake_upstream[1], write_timeout_s=60.0)
    with server:
        running = RunningProxy(server.url, config)
        base = running.new_rollout("dies")
        assert _chat(base)[0] == 200

        def stop_the_thread(self, conn, batch):
            raise SystemExit("simulated death of the writer thread")

        monkeypatch.setattr(GroupCommitWriter, "_commit", stop_the_thread)
        for stream in (False, True, False):
            started = time.monotonic()
            status, text = _chat(base, stream=stream)
            assert time.monotonic() - started < 5  # not the 60 s write bound: the waiters are failed at once
            assert ('"code":503' in text and status == 200) if stream else status == 503, text
            assert "trace store is unavailable" in text
        health = httpx.get(f"{running.url}/health", timeout=_TIMEOUT)
        assert health.status_code == 503 and "simulated death" in health.json()["reason"]
        assert len(running.store().calls("dies")) == 1
        started = time.monotonic()
        server.server.should_exit = True  # what SIGTERM does: the proxy still stops promptly
        server.thread.join(timeout=10)
        assert not server.thread.is_alive() and time.monotonic() - started < 10


def test_a_commit_that_never_returns_is_a_503_within_the_bound(tmp_path, fake_upstream, monkeypatch) -> None:
    from repro.store.writer import GroupCommitWriter

    server, config = start_proxy(tmp_path, fake_upstream[1], write_timeout_s=0.5)
    original = GroupCommitWriter._commit
    with server:
        running = RunningProxy(server.url, config)
        base = running.new_rollout("slow")

        def slow_commit(self, conn, batch):
            time.sleep(1.5)
            return original(self, conn, batch)

        monkeypatch.setattr(GroupCommitWriter, "_commit", slow_commit)
        started = time.monotonic()
        status, text = _chat(base)
        assert status == 503 and "within 0.5s" in text and time.monotonic() - started < 1.4
        monkeypatch.setattr(GroupCommitWriter, "_commit", original)
        time.sleep(1.5)  # the late commit lands (the call was not acknowledged, but nothing is lost)
        assert [c.seq for c in running.store().calls("slow")] == [0]
        assert_next_calls_work(running, "slow", base, n=2)

"""The group-commit writer cannot die on a bad record, never leaves a waiter hanging, and keeps delta encoding
consistent when a batch has to be retried one call at a time."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.store import CallRecord, GroupCommitWriter, RolloutRecord, TraceStoreConfig, open_store
from repro.store.writer import CallNotStored, WriterStopped, WriterTimeout

pytestmark = pytest.mark.timeout(60)


def _writer(tmp_path: Path, **kwargs) -> tuple[GroupCommitWriter, str]:
    path = str(tmp_path / "traces.sqlite")
    store = open_store(path)
    store.create_rollout(RolloutRecord(rollout_id="r"))
    store.close()
    return GroupCommitWriter(TraceStoreConfig(path=path), **kwargs), path


def _call(seq: int, prompt: list[int], completion: list[int], logprobs: list | None = None) -> CallRecord:
    return CallRecord(rollout_id="r", seq=seq, endpoint="chat", status="ok", prompt_ids=prompt,
                      completion_ids=completion, logprobs=[-0.5] * len(completion) if logprobs is None else logprobs,
                      request={"messages": [{"role": "user", "content": str(seq)}]})


@pytest.mark.parametrize("bad", [
    {"completion": [1, 2**31]},                 # outside int32
    {"completion": [1, 2], "logprobs": [None, -1.0]},
    {"completion": [1, "x"]},
])
def test_a_call_that_cannot_be_encoded_is_stored_as_failed_and_the_writer_goes_on(tmp_path, bad) -> None:
    writer, path = _writer(tmp_path)
    writer.write_sync(_call(0, [5, 6], [7]))
    with pytest.raises(CallNotStored) as info:
        writer.write_sync(_call(1, [5, 6, 7, 8], bad["completion"], bad.get("logprobs")))
    assert info.value.recorded
    prompt = [5, 6, 7, 8]
    for seq in range(2, 12):
        writer.write_sync(_call(seq, prompt, [seq]))
        prompt = [*prompt, seq, 9]
    assert writer.healthy and writer.stored_as_failed == 1
    writer.close()
    calls = open_store(path).calls("r")
    assert [c.seq for c in calls] == list(range(12))
    assert calls[1].status == "error" and "could not store this call" in calls[1].error
    assert calls[1].completion_ids is None and calls[1].request["messages"][0]["content"] == "1"
    assert calls[11].prompt_ids == prompt[:-2] and calls[11].completion_ids == [11]  # rebuilt through the deltas


@settings(max_examples=25, deadline=None)
@given(bad_positions=st.sets(st.integers(min_value=0, max_value=11), max_size=4))
def test_a_batch_with_bad_calls_keeps_every_good_call_exactly(tmp_path_factory, bad_positions) -> None:
    """Calls submitted together (one transaction) with some bad ones: the batch is retried call by call; every
    good call's prompt rebuilds exactly (no delta against a call that was not stored), bad ones are failures."""
    writer, path = _writer(tmp_path_factory.mktemp("w"))
    gate = threading.Event()
    done: list[BaseException | None] = []
    writer.submit(CallRecord(rollout_id="r", seq=0, endpoint="chat", status="ok"), lambda e: gate.wait(5))
    prompts, prompt = [], [1]
    for seq in range(1, 13):
        completion = [seq, 2**40] if seq - 1 in bad_positions else [seq]
        prompts.append(list(prompt))
        writer.submit(_call(seq, list(prompt), completion), done.append)
        prompt = [*prompt, seq, 3]  # what the harness sends next (the bad value never enters a prompt)
    gate.set()
    deadline = time.monotonic() + 10
    while len(done) < 12 and time.monotonic() < deadline:
        time.sleep(0.01)
    writer.close()
    calls = {c.seq: c for c in open_store(path).calls("r")}
    for seq in range(1, 13):
        if seq - 1 in bad_positions:
            assert isinstance(done[seq - 1], CallNotStored) and calls[seq].status == "error"
        else:
            assert done[seq - 1] is None and calls[seq].prompt_ids == prompts[seq - 1]


def test_a_writer_thread_that_ends_fails_every_waiter_at_once(tmp_path, monkeypatch) -> None:
    writer, _ = _writer(tmp_path, write_timeout_s=60.0)

    def die(self, conn, batch):
        raise SystemExit("simulated")

    monkeypatch.setattr(GroupCommitWriter, "_commit", die)
    started = time.monotonic()
    with pytest.raises(WriterStopped, match="simulated"):
        writer.write_sync(_call(0, [1], [2]))
    with pytest.raises(WriterStopped):
        asyncio.run(writer.write(_call(1, [1], [2])))
    assert time.monotonic() - started < 5 and not writer.healthy and "simulated" in writer.failure
    assert writer.close(timeout_s=1)


def test_every_wait_is_bounded(tmp_path, monkeypatch) -> None:
    writer, _ = _writer(tmp_path)
    release = threading.Event()
    original = GroupCommitWriter._commit

    def stuck(self, conn, batch):
        release.wait(10)
        return original(self, conn, batch)

    monkeypatch.setattr(GroupCommitWriter, "_commit", stuck)
    started = time.monotonic()
    with pytest.raises(WriterTimeout):
        writer.write_sync(_call(0, [1], [2]), timeout_s=0.3)
    with pytest.raises(WriterTimeout):
        asyncio.run(writer.write(_call(1, [1], [2]), timeout_s=0.3))
    assert time.monotonic() - started < 3
    release.set()
    assert writer.close(timeout_s=5)  # close flushes what was queued


def test_ids_outside_the_vocabulary_are_refused_on_the_tokens_a_call_adds(tmp_path) -> None:
    writer, path = _writer(tmp_path, vocab_size=10)
    writer.write_sync(_call(0, [1, 2], [3]))
    with pytest.raises(CallNotStored) as info:
        writer.write_sync(_call(1, [1, 2, 3, 4, 11], [5]))  # extends call 0: only [4, 11] is new
    assert info.value.upstream_fault and info.value.recorded
    assert "prompt_token_ids[4]=11" in info.value.reason and "vocabulary of 10" in info.value.reason
    with pytest.raises(CallNotStored, match=r"token_ids\[1\]=-1"):
        writer.write_sync(_call(2, [1, 2, 3, 4], [5, -1]))
    writer.write_sync(_call(3, [1, 2, 3], [9]))
    writer.close()
    calls = open_store(path).calls("r")
    assert [c.status for c in calls] == ["ok", "error", "error", "ok"]
    assert calls[1].error.startswith("upstream returned") and calls[3].prompt_ids == [1, 2, 3]

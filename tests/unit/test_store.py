"""Trace store: encodings, group commit, prefix drift, and stream assembly invariants."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.proxy.assemble import StreamAccumulator
from repro.store import CallRecord, GroupCommitWriter, RolloutRecord, TraceStoreConfig, open_store
from repro.store.drift import extends
from repro.store.trace_records import decode_floats, decode_ids, encode_floats, encode_ids
from repro.testing import FakeVllmUpstream

token_lists = st.lists(st.integers(min_value=0, max_value=2**31 - 2), max_size=200)


@given(token_lists)
def test_token_ids_round_trip(ids: list[int]) -> None:
    assert decode_ids(encode_ids(ids)) == ids


@given(st.lists(st.floats(min_value=-100, max_value=0, width=32), max_size=100))
def test_logprobs_round_trip(values: list[float]) -> None:
    assert decode_floats(encode_floats(values)) == values


@given(token_lists, token_lists, token_lists)
def test_extends_means_prefix(prompt: list[int], completion: list[int], suffix: list[int]) -> None:
    assert extends(encode_ids(prompt), encode_ids(completion), encode_ids(prompt + completion + suffix))
    if completion:
        changed = [*prompt, completion[0] + 1, *completion[1:], *suffix]
        assert not extends(encode_ids(prompt), encode_ids(completion), encode_ids(changed))


def _sse_bytes(text_len: int) -> bytes:
    fake = FakeVllmUpstream(completion_tokens=text_len, tokens_per_chunk=3)
    body = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "stream": True,
            "stream_options": {"include_usage": True}}
    chunks = fake._chunks(body, "chat", "abcdefghijklmnopqrstuvwxyz"[:text_len])  # ends with data: [DONE]
    return b"".join(chunks)


def _filled(acc: StreamAccumulator) -> CallRecord:
    call = CallRecord("r", 0, "chat", "ok")
    acc.fill(call)
    return call


@settings(max_examples=60)
@given(st.integers(min_value=1, max_value=26), st.lists(st.integers(min_value=1, max_value=400), max_size=30))
def test_stream_assembly_does_not_depend_on_how_bytes_are_split(text_len: int, cuts: list[int]) -> None:
    data = _sse_bytes(text_len)
    whole = StreamAccumulator()
    whole.feed(data)
    pieces = StreamAccumulator()
    start, passed_on = 0, []
    for cut in cuts:
        passed_on.append(pieces.feed(data[start : start + cut]))
        start += cut
    passed_on.append(pieces.feed(data[start:]))
    assert whole.done and pieces.done
    assert b"".join(passed_on) == data  # what is passed on: every event whole, in order, none dropped
    assert _filled(pieces) == _filled(whole)
    assert bytes(whole.completion_ids).decode() == "abcdefghijklmnopqrstuvwxyz"[:text_len]


def test_group_commit_writes_every_call_once_and_tracks_drift(tmp_path: Path) -> None:
    config = TraceStoreConfig(path=str(tmp_path / "t.sqlite"))
    store = open_store(config.path)
    store.create_rollout(RolloutRecord("r"))
    writer = GroupCommitWriter(config)
    done = threading.Semaphore(0)
    prompt: list[int] = [1, 2]
    n = 300
    for seq in range(n):
        completion = [seq % 7, 9]
        call = CallRecord("r", seq, "chat", "ok", request={"i": seq}, prompt_ids=list(prompt),
                          completion_ids=completion)
        writer.submit(call, lambda exc: done.release())
        prompt = prompt + completion + [5] if seq != 100 else [1, 2, 3]  # one break, after call 100
    for _ in range(n):
        assert done.acquire(timeout=30)
    writer.close()
    calls = store.calls("r")
    assert [c.seq for c in calls] == list(range(n))
    assert [c.request["i"] for c in calls] == list(range(n))
    assert writer.commits < n  # calls shared transactions
    flags = [c.extends_previous for c in calls]
    assert flags[0] is None and flags[101] is False
    assert all(flags[1:101]) and all(flags[102:])
    summary = store.drift_summary("r")
    assert (summary.comparable, summary.extending, summary.first_break_seq) == (n - 1, n - 2, 101)


def test_duplicate_call_is_reported_not_silently_dropped(tmp_path: Path) -> None:
    config = TraceStoreConfig(path=str(tmp_path / "t.sqlite"))
    writer = GroupCommitWriter(config)
    writer.write_sync(CallRecord("r", 0, "chat", "ok"))
    try:
        writer.write_sync(CallRecord("r", 0, "chat", "ok"))
    except Exception as exc:  # sqlite3.IntegrityError from the writer thread
        assert "UNIQUE" in str(exc) or "constraint" in str(exc).lower()
    else:
        raise AssertionError("a duplicate (rollout, seq) was accepted")
    finally:
        writer.close()
    assert open_store(config.path).count_calls() == 1


def test_rollout_lifecycle(tmp_path: Path) -> None:
    store = open_store(tmp_path / "t.sqlite")
    store.create_run("run1", {"seed": 1})
    store.create_rollout(RolloutRecord("a", run_id="run1", task_id="t", metadata={"k": 1}))
    store.finish_rollout("a", "failed", failure_reason="harness crashed: exit 1")
    (rollout,) = store.list_rollouts("run1")
    assert rollout.status == "failed" and rollout.failure_reason == "harness crashed: exit 1"
    assert rollout.metadata == {"k": 1}
    assert orjson.loads(orjson.dumps(rollout.metadata)) == {"k": 1}


step = st.tuples(st.sampled_from(["extend", "break", "error"]), token_lists.filter(bool), st.booleans(),
                 st.sampled_from(["append", "rewrite", "none"]))


@settings(max_examples=40, deadline=None)
@given(st.lists(step, min_size=1, max_size=12))
def test_delta_encoded_calls_read_back_exactly(tmp_path_factory, steps) -> None:
    """Whatever mix of extending, breaking and failed calls, message histories that grow or are rewritten,
    and writer restarts, prompts and requests read back whole."""
    config = TraceStoreConfig(path=str(tmp_path_factory.mktemp("s") / "t.sqlite"))
    writer = GroupCommitWriter(config)
    prompt, completion, messages = [1], [2], [{"role": "system", "content": "s"}]
    expected_prompts, expected_requests = [], []
    for seq, (kind, tokens, restart, history) in enumerate(steps):
        if history == "append":
            messages = [*messages, {"role": "user", "content": str(tokens)}]
        elif history == "rewrite":
            messages = [{"role": "user", "content": f"summary {seq}"}]
        request = {"model": "m", "messages": messages} if history != "none" else {"model": "m", "prompt": "p"}
        if kind == "error":
            call = CallRecord("r", seq, "chat", "error", request=request)
            expected_prompts.append(None)
        else:
            prompt = prompt + completion + tokens if kind == "extend" else tokens
            completion = tokens[:3]
            call = CallRecord("r", seq, "chat", "ok", request=request, prompt_ids=prompt, completion_ids=completion)
            expected_prompts.append(prompt)
        expected_requests.append(request)
        writer.write_sync(call)
        if restart:  # a new writer has no cache: it must rebuild the previous call from the database
            writer.close()
            writer = GroupCommitWriter(config)
    writer.close()
    calls = open_store(config.path).calls("r")
    assert [c.prompt_ids for c in calls] == expected_prompts
    assert [c.request for c in calls] == expected_requests


def test_extending_rollout_storage_grows_linearly(tmp_path: Path) -> None:
    config = TraceStoreConfig(path=str(tmp_path / "t.sqlite"))
    writer = GroupCommitWriter(config)
    prompt, turns, per_turn = list(range(1000)), 50, 100
    for seq in range(turns):
        completion = list(range(per_turn))
        writer.write_sync(CallRecord("r", seq, "chat", "ok", prompt_ids=prompt, completion_ids=completion))
        prompt = prompt + completion + list(range(per_turn))
    writer.close()
    store = open_store(config.path)
    unique_tokens = 1000 + turns * 2 * per_turn
    assert store.stored_token_bytes() <= 4 * unique_tokens  # quadratic would be ~ 4 * turns * mean prompt
    assert len(store.calls("r")[-1].prompt_ids) == 1000 + (turns - 1) * 2 * per_turn


def test_growing_message_history_is_stored_once(tmp_path: Path) -> None:
    config = TraceStoreConfig(path=str(tmp_path / "t.sqlite"))
    writer = GroupCommitWriter(config)
    messages = [{"role": "system", "content": "x" * 4000}]
    for seq in range(40):
        messages = [*messages, {"role": "user", "content": f"observation {seq} " + "o" * 200}]
        writer.write_sync(CallRecord("r", seq, "chat", "ok", request={"model": "m", "messages": messages}))
    writer.close()
    store = open_store(config.path)
    stored = store.conn.execute("SELECT sum(length(request_json)) FROM calls").fetchone()[0]
    assert stored < 4000 + 40 * 400  # each message once, not the whole history per call
    assert store.calls("r")[-1].request["messages"] == messages


def test_run_drift_summary_counts_rollouts_with_breaks(tmp_path: Path) -> None:
    config = TraceStoreConfig(path=str(tmp_path / "t.sqlite"))
    store = open_store(config.path)
    writer = GroupCommitWriter(config)
    for rollout_id, second_prompt in (("a", [1, 2, 3]), ("b", [9])):
        store.create_rollout(RolloutRecord(rollout_id, run_id="run"))
        writer.write_sync(CallRecord(rollout_id, 0, "chat", "ok", prompt_ids=[1], completion_ids=[2]))
        writer.write_sync(CallRecord(rollout_id, 1, "chat", "ok", prompt_ids=second_prompt, completion_ids=[4]))
    writer.close()
    summary = store.run_drift_summary("run")
    assert (summary.rollouts, summary.calls, summary.comparable, summary.extending) == (2, 4, 2, 1)
    assert summary.rollouts_with_break == 1 and summary.extend_rate == 0.5


def test_side_calls_between_agent_calls_keep_its_prefix_chain(tmp_path: Path) -> None:
    """Drift and delta encoding compare a call with the previous call *of its purpose*: an auxiliary call in
    between neither counts as drift nor stops the agent's prompt being stored as a suffix; all read back whole."""
    config = TraceStoreConfig(path=str(tmp_path / "t.sqlite"))
    writer = GroupCommitWriter(config)
    agent = [list(range(100)), [*range(100), 500, 501, 7], [*range(100), 500, 501, 7, 502, 8]]
    writer.write_sync(CallRecord("r", 0, "chat", "ok", prompt_ids=agent[0], completion_ids=[500, 501]))
    writer.write_sync(CallRecord("r", 1, "chat", "ok", prompt_ids=[9, 9, 9], completion_ids=[600],
                                 purpose="auxiliary"))
    writer.write_sync(CallRecord("r", 2, "chat", "ok", prompt_ids=agent[1], completion_ids=[502]))
    writer.close()
    writer = GroupCommitWriter(config)  # no cache: the base call is found in the database
    writer.write_sync(CallRecord("r", 3, "chat", "ok", prompt_ids=[9, 9, 9, 600, 1], completion_ids=[601],
                                 purpose="auxiliary"))
    writer.write_sync(CallRecord("r", 4, "chat", "ok", prompt_ids=agent[2], completion_ids=[503]))
    writer.close()
    store = open_store(config.path)
    calls = store.calls("r")
    assert [c.prompt_ids for c in calls] == [agent[0], [9, 9, 9], agent[1], [9, 9, 9, 600, 1], agent[2]]
    assert [c.purpose for c in calls] == ["policy", "auxiliary", "policy", "auxiliary", "policy"]
    assert [c.extends_previous for c in calls] == [None, None, True, True, True]
    assert store.drift_summary("r").breaks == 0
    assert store.stored_token_bytes() < 4 * (sum(map(len, agent)) + 3)  # the agent's prompts went in as suffixes


def test_store_from_before_call_purposes_is_upgraded(tmp_path: Path) -> None:
    """A version-4 store (no purpose / prefix_seq columns) opens, reads back, and takes new calls."""
    path = tmp_path / "old.sqlite"
    writer = GroupCommitWriter(TraceStoreConfig(path=str(path)))
    writer.write_sync(CallRecord("r", 0, "chat", "ok", prompt_ids=[1, 2], completion_ids=[3]))
    writer.write_sync(CallRecord("r", 1, "chat", "ok", prompt_ids=[1, 2, 3, 4], completion_ids=[5]))
    writer.close()
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE calls DROP COLUMN purpose")
        conn.execute("ALTER TABLE calls DROP COLUMN prefix_seq")
    writer = GroupCommitWriter(TraceStoreConfig(path=str(path)))
    writer.write_sync(CallRecord("r", 2, "chat", "ok", prompt_ids=[1, 2, 3, 4, 5, 6], completion_ids=[7]))
    writer.close()
    calls = open_store(path).calls("r")
    assert [c.prompt_ids for c in calls] == [[1, 2], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6]]
    assert {c.purpose for c in calls} == {"policy"}

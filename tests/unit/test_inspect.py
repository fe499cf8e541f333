"""`repro inspect`: a run's samples by outcome, and one rollout's turns with the grader's verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repro.evaluation.reports import InstanceReport, write_report
from repro.report.inspect import inspect_path
from repro.report.turns import assistant_output, observation, turns
from repro.store import CallRecord, GroupCommitWriter, RolloutRecord, TraceStoreConfig, open_store

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
TASK = {"role": "user", "content": "add(2, 3) returns -1. Fix add in calc.py."}


def _tool_call(call_id: str, command: str) -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})}}


def _response(message: dict, finish: str = "tool_calls") -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}]}


def _conversation() -> list[CallRecord]:
    """Three calls of a tool-calling harness: cat the file, fix it with sed, submit."""
    a1 = {"content": "Let me look.", "tool_calls": [_tool_call("c1", "cat calc.py")]}
    a2 = {"content": None, "tool_calls": [_tool_call("c2", "sed -i 's/a - b/a + b/' calc.py")]}
    a3 = {"content": "", "tool_calls": [_tool_call("c3", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")]}
    m1 = [SYSTEM, TASK]
    m2 = [*m1, {"role": "assistant", **a1}, {"role": "tool", "tool_call_id": "c1",
                                             "content": "def add(a, b):\n    return a - b\n"}]
    m3 = [*m2, {"role": "assistant", **a2}, {"role": "tool", "tool_call_id": "c2", "content": [
        {"type": "text", "text": "(no output)"}]}]
    return [CallRecord("r-good", seq, "chat", "ok", request={"model": "m", "messages": msgs}, response=_response(a),
                       prompt_tokens=100 * (seq + 1), completion_tokens=20, finish_reason="tool_calls")
            for seq, (msgs, a) in enumerate([(m1, a1), (m2, a2), (m3, a3)])]


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    config = TraceStoreConfig(path=str(run / "traces.sqlite"))
    store = open_store(config.path)
    for rid, task in [("r-good", "calc-1"), ("r-bad", "calc-2"), ("r-err", "calc-3"), ("r-lost", "calc-4")]:
        store.create_rollout(RolloutRecord(rid, task_id=task, harness="mini-swe-agent", harness_version="2.4.6"))
    writer = GroupCommitWriter(config)
    for call in _conversation():
        writer.write_sync(call)
    writer.write_sync(CallRecord("r-bad", 0, "chat", "ok", request={"messages": [SYSTEM, TASK]},
                                 response=_response({"content": "I think it is fine."}, "stop")))
    writer.close()
    store.close()
    tests = {"test_calc.py::test_add": "PASSED", "test_calc.py::test_sub": "PASSED"}
    write_report(run, InstanceReport("calc-1", 0, "r-good", "resolved", harness_status="finished",
                                     harness_exit_status="Submitted", n_calls=3, tests=tests,
                                     fail_to_pass=["test_calc.py::test_add"], pass_to_pass=["test_calc.py::test_sub"]),
                 "diff")
    write_report(run, InstanceReport("calc-2", 0, "r-bad", "unresolved", reason="FAIL_TO_PASS failed: 1 of 1",
                                     harness_status="finished", harness_exit_status="LimitsExceeded",
                                     tests={**tests, "test_calc.py::test_add": "FAILED"},
                                     fail_to_pass=["test_calc.py::test_add"], pass_to_pass=["test_calc.py::test_sub"]),
                 "")
    write_report(run, InstanceReport("calc-3", 0, "r-err", "error", reason="test patch did not apply",
                                     harness_status="crashed", harness_reason="worker died",
                                     grade_log_tail="error: patch failed: test_calc.py:3"), "")
    return run


def test_turns_pair_each_action_with_the_next_observation() -> None:
    calls = _conversation()
    got = turns(calls)
    assert [t.action for t in got] == ["bash: cat calc.py", "bash: sed -i 's/a - b/a + b/' calc.py",
                                       "bash: echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]
    assert got[0].thought == "Let me look."
    assert got[0].observation == "[tool] def add(a, b):\n    return a - b\n"
    assert got[1].observation == "[tool] (no output)"  # list-of-parts content
    assert got[2].observation is None  # nothing came after the last call


def test_text_answers_failed_calls_and_completions() -> None:
    text = CallRecord("r", 0, "chat", "ok", response=_response({"content": "```bash\nls\n```"}, "stop"))
    assert assistant_output(text) == ("```bash\nls\n```", "")
    failed = CallRecord("r", 1, "chat", "error", error="upstream 500")
    assert assistant_output(failed)[0] == "(call error: upstream 500)"
    first = CallRecord("r", 0, "completions", "ok", request={"prompt": "P"}, response={"choices": [{"text": "A"}]})
    follow = CallRecord("r", 1, "completions", "ok", request={"prompt": "PA obs"})
    assert observation(first, follow) == " obs"
    fresh = CallRecord("r", 1, "chat", "ok", request={"messages": [SYSTEM, TASK]})
    assert "does not continue" in observation(text, fresh)


def test_run_listing_groups_samples_by_outcome_with_reasons(tmp_path: Path, capsys) -> None:
    run = _run_dir(tmp_path)
    inspect_path(run)
    out = capsys.readouterr().out
    assert out.index("resolved (1)") < out.index("unresolved (1)") < out.index("infrastructure failures (")
    assert "FAIL_TO_PASS failed: 1 of 1" in out and "test patch did not apply" in out
    assert "harness crashed: worker died" in out and "LimitsExceeded" in out
    assert "infra-failure 1" in out
    assert "no report: in flight" in out and "r-lost" in out  # registered but never graded


def test_one_rollout_shows_turns_and_verdict(tmp_path: Path, capsys) -> None:
    run = _run_dir(tmp_path)
    inspect_path(run, "calc-1")  # an instance id: its samples' rollouts
    out = capsys.readouterr().out
    assert "add(2, 3) returns -1" in out  # the task
    assert out.index("cat calc.py") < out.index("return a - b") < out.index("sed -i")
    assert "verdict: resolved" in out and "test_calc.py::test_add" in out
    assert out.index("FAIL_TO_PASS") < out.index("PASS_TO_PASS")  # the tests the fix must make pass come first
    inspect_path(run, "r-err")  # a rollout id, with no calls, graded as an infrastructure error
    out = capsys.readouterr().out
    assert "verdict: error test patch did not apply" in out and "patch failed: test_calc.py:3" in out


def test_unknown_targets_and_store_only_paths(tmp_path: Path, capsys) -> None:
    run = _run_dir(tmp_path)
    with pytest.raises(SystemExit, match="no rollout or instance 'nope'"):
        inspect_path(run, "nope")
    inspect_path(run / "traces.sqlite", "r-lost")
    assert "no grader report" in capsys.readouterr().out
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "traces.sqlite").write_bytes((run / "traces.sqlite").read_bytes())
    inspect_path(bare)  # no reports: every rollout in the store-level table
    out = capsys.readouterr().out
    assert "4 rollouts" in out and "r-good" in out and "prefix extends" in out
    with pytest.raises(SystemExit, match="no trace store"):
        inspect_path(tmp_path / "missing")

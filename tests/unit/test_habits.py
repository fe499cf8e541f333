"""Habits counted from stored commands: the slipped edit and the tool-call arguments it is read from."""

from __future__ import annotations

import json

from repro.evaluation.habits import call_commands, is_slipped_edit
from repro.store.trace_records import CallRecord


def _call(*commands: str, content: str = "") -> CallRecord:
    tool_calls = [{"type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": c})}}
                  for c in commands]
    message = {"content": content, "tool_calls": tool_calls}
    return CallRecord(rollout_id="r", seq=0, endpoint="chat", status="ok", response={"choices": [{"message": message}]})


def test_slipped_edits_are_sed_n_substitutions_only() -> None:
    assert is_slipped_edit("sed -n '9s|a - b|a + b|' ./x.py")
    assert is_slipped_edit("sed -n 's|a - b|a + b|' ./x.py && echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
    assert not is_slipped_edit("sed -i '9s|a - b|a + b|' ./x.py")
    assert not is_slipped_edit("sed -n '5,9p' ./x.py")  # looking at lines is no slip
    assert not is_slipped_edit("grep -nF 'sed -n' ./x.py")


def test_commands_are_read_from_tool_calls() -> None:
    assert call_commands(_call("ls", "cat x")) == ["ls", "cat x"]
    broken = _call()
    broken.response["choices"][0]["message"]["tool_calls"] = [{"function": {"arguments": "{not json"}}]
    assert call_commands(broken) == []
    assert call_commands(CallRecord(rollout_id="r", seq=0, endpoint="chat", status="error")) == []


def test_commands_are_read_from_text_mode_blocks() -> None:
    """mini-SWE-agent 1.x answers in text: its command is the fenced ``bash`` block, where the slip shows too."""
    text = "THOUGHT: fix it\n\n```bash\nsed -n '9s|a - b|a + b|' ./x.py\n```"
    assert call_commands(_call(content=text)) == ["sed -n '9s|a - b|a + b|' ./x.py"]
    assert is_slipped_edit(call_commands(_call(content=text))[0])
    assert call_commands(_call(content="```mswea_bash_command\nls\n```")) == ["ls"]
    assert call_commands(_call(content="no command here")) == []
    assert call_commands(_call("ls", content=text)) == ["ls"]  # tool calls, when present, are the commands

"""One rollout as a conversation: for each model call the action the assistant took, the observation that came
back (the new tool/user messages of the next request), and at the end the grader's verdict."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from repro.evaluation.reports import InstanceReport
from repro.store import CallRecord, RolloutRecord


def content_text(content: Any) -> str:
    """Message content as text (plain strings, or lists of parts as OpenHands sends)."""
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


def _tool_call_text(tool_call: dict[str, Any]) -> str:
    fn = tool_call.get("function") or {}
    raw = fn.get("arguments") or ""
    try:
        args = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        return f"{fn.get('name')}: {raw}"
    if isinstance(args, dict) and set(args) == {"command"}:
        return f"{fn.get('name')}: {args['command']}"
    return f"{fn.get('name')}: {json.dumps(args, ensure_ascii=False)}"


@dataclass
class Turn:
    """One model call seen as a step of the agent."""

    seq: int
    action: str  # the tool call command(s), else the assistant's text
    thought: str  # assistant text that came with tool calls
    observation: str | None  # None: no later call (the run ended after this action)
    status: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None


def assistant_output(call: CallRecord) -> tuple[str, str]:
    """(action, thought) of a call: tool calls are the action and text the thought; text only is the action."""
    if call.status != "ok" and not call.response:
        return f"(call {call.status}: {call.error or 'no response'})", ""
    choice = ((call.response or {}).get("choices") or [{}])[0]
    message = choice.get("message") or {}
    text = content_text(message.get("content")) or choice.get("text") or ""
    tools = [_tool_call_text(t) for t in message.get("tool_calls") or ()]
    return ("\n".join(tools), text) if tools else (text, "")


def _last_assistant(messages: list[dict[str, Any]]) -> int | None:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "assistant":
            return index
    return None


def observation(call: CallRecord, next_call: CallRecord | None) -> str | None:
    """What the agent was shown after ``call``'s answer: the next request's messages after its last assistant
    message (chat), or the part of the next prompt beyond this prompt + completion (completions)."""
    if next_call is None or next_call.request is None:
        return None
    request = next_call.request
    if "messages" in request:
        messages = request["messages"]
        last = _last_assistant(messages)
        if last is None:
            return f"(the next request does not continue this conversation: {len(messages)} fresh messages)"
        return "\n".join(f"[{m.get('role')}] {content_text(m.get('content'))}" for m in messages[last + 1:])
    before = str((call.request or {}).get("prompt", "")) + assistant_output(call)[0]
    prompt = str(request.get("prompt", ""))
    return prompt[len(before):] if prompt.startswith(before) else "(the next prompt does not continue this one)"


def turns(calls: list[CallRecord]) -> list[Turn]:
    out = []
    for index, call in enumerate(calls):
        action, thought = assistant_output(call)
        following = calls[index + 1] if index + 1 < len(calls) else None
        out.append(Turn(call.seq, action, thought, observation(call, following), call.status, call.finish_reason,
                        call.prompt_tokens, call.completion_tokens))
    return out


def task_text(calls: list[CallRecord]) -> str:
    """The first user message of the rollout (the task as the harness phrased it)."""
    for message in ((calls[0].request or {}).get("messages") or []) if calls else []:
        if message.get("role") == "user":
            return content_text(message.get("content"))
    return ""


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n… ({len(text) - limit} more characters)"


def turn_panel(turn: Turn, number: int, limit: int) -> Panel:
    parts: list[RenderableType] = []
    if turn.thought:
        parts.append(Text(clip(turn.thought, limit), style="dim"))
    parts.append(Text("action: ", style="bold cyan") + Text(clip(turn.action, limit) or "(empty)"))
    seen = "(none: the rollout ended after this call)" if turn.observation is None else turn.observation
    parts.append(Text("observation: ", style="bold magenta") + Text(clip(seen, limit) or "(empty)"))
    tokens = f"{turn.prompt_tokens or 0}+{turn.completion_tokens or 0} tokens"
    title = f"turn {number} · call {turn.seq} · {turn.status} · finish={turn.finish_reason or '-'} · {tokens}"
    return Panel(Group(*parts), title=title, title_align="left")


def verdict(report: InstanceReport) -> Group:
    """The grader's verdict: outcome and reason, then each graded test, what it should be and what it was."""
    style = "green" if report.outcome == "resolved" else "red"
    head = Text("verdict: ", style="bold") + Text(report.outcome, style=f"bold {style}")
    head += Text(f" {report.reason}" if report.reason else "")
    tests = graded_tests(report)
    if not tests:
        return Group(head, Text("(no test statuses recorded)", style="dim"))
    table = Table()
    for column in ("test", "kind", "status"):
        table.add_column(column, overflow="fold")
    for test, kind, status in tests:
        table.add_row(test, kind, Text(status, style="green" if status == "PASSED" else "red"))
    return Group(head, table)


def graded_tests(report: InstanceReport) -> list[tuple[str, str, str]]:
    """(test, FAIL_TO_PASS / PASS_TO_PASS / -, status or MISSING): the graded tests first, then any others run."""
    kinds = {**{t: "FAIL_TO_PASS" for t in report.fail_to_pass}, **{t: "PASS_TO_PASS" for t in report.pass_to_pass}}
    tests = list(kinds) + [t for t in report.tests if t not in kinds]
    return [(t, kinds.get(t, "-"), report.tests.get(t, "MISSING")) for t in tests]


def rollout_view(rollout: RolloutRecord, calls: list[CallRecord], report: InstanceReport | None,
                 limit: int = 1500) -> Group:
    """Header, task, turns and verdict of one rollout."""
    head = Text(f"rollout {rollout.rollout_id} · task {rollout.task_id} · {rollout.harness}@{rollout.harness_version}"
                f" · status {rollout.status} · {len(calls)} calls", style="bold")
    parts: list[RenderableType] = [head]
    if report is not None:
        parts.append(Text(f"harness: {report.harness_status} ({report.harness_exit_status or report.harness_reason})"
                          f" · patch {report.patch_bytes} bytes (+{report.patch_added}/-{report.patch_removed})"))
    if calls:
        parts.append(Panel(Text(clip(task_text(calls), limit)), title="task", title_align="left"))
    else:
        parts.append(Text("(no model calls recorded)", style="dim"))
    parts += [turn_panel(t, n, limit) for n, t in enumerate(turns(calls), 1)]
    if report is not None:
        parts.append(verdict(report))
        if report.outcome in ("error", "timeout") and report.grade_log_tail:
            parts.append(Panel(Text(clip(report.grade_log_tail, limit)), title="grader log (tail)"))
    else:
        reward = "-" if rollout.reward is None else f"{rollout.reward:g}"
        parts.append(Text(f"no grader report for this rollout; store says reward {reward}, "
                          f"failure {rollout.failure_reason or '-'}"))
    return Group(*parts)

"""A trainer-owned rebuild of mini-SWE-agent 2.4.6's loop (tool-call mode), token-in/token-out.

This is the baseline the field uses (verl, AReaL, slime own the loop): the trainer re-implements the agent and
talks to the model server in token ids. It reads the pinned harness's own prompts (the same YAML the real
harness is given) and follows 2.4.6's control flow, read from its ``DefaultAgent`` / ``LocalEnvironment``:

- query: ``LimitsExceeded`` once ``0 < step_limit <= calls``, ``TimeExceeded`` once the wall-time limit passed;
- a reply without a valid ``bash`` tool call is a format error: the reply is dropped from the history and the
  rendered ``format_error_template`` goes in as a user message; ``max_consecutive_format_errors`` in a row end
  the run (``RepeatedFormatError``);
- each action runs as ``bash`` in the workdir with the harness's environment and timeout; an output whose first
  line is ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` (exit code 0) ends the run (``Submitted``), otherwise the
  outputs come back as ``tool`` messages rendered with ``observation_template``.

What differs from the real harness is the point of the baseline: prompts are the loop's own token ids (what the
model sampled, plus the template's text for each new message) instead of the server re-rendering the messages.
:mod:`repro.rl.rebuilt.fidelity` measures where that makes the prompts differ.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from jinja2 import StrictUndefined, Template

from repro.rl.rebuilt.conversation import TokenConversation
from repro.serving.tool_parser import parse_tool_calls

WRITTEN_FOR = "2.4.6"
SUBMIT_LINE = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
NO_TOOL_CALL = "No tool calls found in the response. Every response MUST include at least one tool call."


class LoopExit(Exception):
    """The run ends with ``exit_status``."""

    def __init__(self, exit_status: str, detail: str = "") -> None:
        super().__init__(exit_status)
        self.exit_status, self.detail = exit_status, detail


class FormatError(Exception):
    """The reply had no usable tool call; ``message`` is the user message the harness would add."""

    def __init__(self, message: dict[str, Any]) -> None:
        super().__init__(message["content"])
        self.message = message


@dataclass
class LoopSpec:
    """The harness settings the loop follows: templates and environment from the pinned config, plus limits."""

    system_template: str
    instance_template: str
    observation_template: str
    format_error_template: str
    tools: list[dict[str, Any]]
    step_limit: int = 0
    wall_time_limit_s: int = 0
    max_format_errors: int = 3
    command_timeout_s: int = 30
    command_env: dict[str, str] = field(default_factory=dict)
    platform: dict[str, str] = field(default_factory=dict)  # pinned uname fields (the harness's ``platform``)
    sampling: dict[str, Any] = field(default_factory=dict)  # temperature / max_tokens as the harness sends them


@dataclass
class Completion:
    """One model call: the prompt sent, what came back."""

    prompt_ids: list[int]
    completion_ids: list[int]
    text: str
    finish_reason: str


class CompletionClient:
    """Token-in/token-out calls to an OpenAI-compatible ``/completions`` route (the proxy's, per rollout)."""

    def __init__(self, base_url: str, model: str, sampling: dict[str, Any], timeout_s: float = 600.0) -> None:
        self.url, self.model, self.sampling = f"{base_url.rstrip('/')}/completions", model, sampling
        self.http = httpx.Client(timeout=timeout_s)

    def complete(self, prompt_ids: list[int]) -> Completion:
        body = {"model": self.model, "prompt": prompt_ids, "return_token_ids": True, **self.sampling}
        response = self.http.post(self.url, json=body)
        response.raise_for_status()
        choice = response.json()["choices"][0]
        return Completion(prompt_ids, list(choice["token_ids"]), choice["text"], choice["finish_reason"])

    def close(self) -> None:
        self.http.close()


class RebuiltLoop:
    """One rollout of the rebuilt loop; :meth:`run` returns the exit status (see the module docstring)."""

    def __init__(self, spec: LoopSpec, tokenizer: Any, model: Any, workdir: Path, deadline_s: float = 0.0) -> None:
        """``model``: anything with ``complete(prompt_ids) -> Completion``; ``deadline_s``: the runner's own
        timeout (a stop like the pool's watchdog, reported as ``timed_out``), 0 = none."""
        self.spec, self.tokenizer, self.model, self.workdir = spec, tokenizer, model, Path(workdir)
        self.n_calls, self.format_errors, self.deadline_s, self.timed_out = 0, 0, deadline_s, False
        self.started = time.monotonic()
        self.conversation: TokenConversation | None = None
        self.outputs: list[dict[str, Any]] = []  # every executed action's raw output, in order

    def run(self, task: str) -> str:
        variables = {**platform.uname()._asdict(), **self.spec.platform, "task": task}
        self.conversation = TokenConversation(self.tokenizer, self.spec.tools, [
            {"role": "system", "content": render(self.spec.system_template, variables)},
            {"role": "user", "content": render(self.spec.instance_template, variables)},
        ])
        while True:
            try:
                self.step()
                self.format_errors = 0
            except FormatError as error:
                self.format_errors += 1
                self.conversation.add_messages([error.message])
                if 0 < self.spec.max_format_errors <= self.format_errors:
                    return "RepeatedFormatError"
            except LoopExit as done:
                return done.exit_status

    def step(self) -> None:
        completion = self.query()
        actions, message = self.parse(completion)
        self.conversation.add_completion(completion.completion_ids, message)
        outputs = [self.execute(action) for action in actions]
        self.conversation.add_messages([self.observation(a, o) for a, o in zip(actions, outputs, strict=True)])

    def query(self) -> Completion:
        if 0 < self.spec.step_limit <= self.n_calls:
            raise LoopExit("LimitsExceeded")
        elapsed = time.monotonic() - self.started
        self.timed_out = 0 < self.deadline_s <= elapsed
        if self.timed_out or 0 < self.spec.wall_time_limit_s <= int(elapsed):
            raise LoopExit("TimeExceeded")
        self.n_calls += 1
        return self.model.complete(self.conversation.prompt_ids())

    def parse(self, completion: Completion) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The bash actions of a reply and its assistant message; :class:`FormatError` when there are none."""
        content, tool_calls = parse_tool_calls(completion.text)
        errors = next((e for e in map(_call_errors, tool_calls) if e), "") if tool_calls else NO_TOOL_CALL
        if errors:
            reason = "tool_calls" if tool_calls else completion.finish_reason
            text = render(self.spec.format_error_template, {
                "error": errors, "actions": [], "has_tool_calls": bool(tool_calls), "finish_reason": reason})
            raise FormatError({"role": "user", "content": text})
        actions = [{"command": _arguments(call)["command"], "tool_call_id": call["id"]} for call in tool_calls]
        return actions, {"role": "assistant", "content": content, "tool_calls": tool_calls}

    def execute(self, action: dict[str, Any]) -> dict[str, Any]:
        output = run_command(action["command"], self.workdir, self.spec.command_env, self.spec.command_timeout_s)
        self.outputs.append(output)
        lines = output["output"].lstrip().splitlines()
        if lines and lines[0].strip() == SUBMIT_LINE and output["returncode"] == 0:
            raise LoopExit("Submitted", "".join(output["output"].lstrip().splitlines(keepends=True)[1:]))
        return output

    def observation(self, action: dict[str, Any], output: dict[str, Any]) -> dict[str, Any]:
        content = render(self.spec.observation_template, {"output": output})
        return {"role": "tool", "tool_call_id": action["tool_call_id"], "content": content}


def render(template: str, variables: dict[str, Any]) -> str:
    return Template(template, undefined=StrictUndefined).render(**variables)


def _arguments(call: dict[str, Any]) -> Any:
    try:
        return json.loads(call["function"]["arguments"])
    except json.JSONDecodeError:
        return None


def _call_errors(call: dict[str, Any]) -> str:
    """2.4.6's checks on one tool call, in its words (joined as it joins them); empty when the call is fine."""
    args = _arguments(call)
    errors = "" if args is not None else "Error parsing tool call arguments."
    if call["function"]["name"] != "bash":
        errors += f"Unknown tool '{call['function']['name']}'."
    if not isinstance(args, dict) or "command" not in args:
        errors += "Missing 'command' argument in bash tool call."
    return errors.strip()


def run_command(command: str, cwd: Path, env: dict[str, str], timeout_s: int) -> dict[str, Any]:
    """``bash`` in its own session, stdout+stderr merged; on timeout the whole group is killed."""
    proc = subprocess.Popen(command, shell=True, text=True, cwd=cwd, env=env, encoding="utf-8", errors="replace",
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, _ = proc.communicate()
        return {"output": stdout or "", "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {exc}"}
    return {"output": stdout, "returncode": proc.returncode, "exception_info": ""}

"""The scripted expert: its completion is the gold one-line fix as one shell tool call, or as one ```` ```bash ````
block when the prompt offers no tools (a text-mode harness) (served by :class:`repro.serving.scripted.ScriptedEngine`).

``sed -i 's|OLD|NEW|' FILE && echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` (``Ns|OLD|NEW|`` when OLD is not
unique in the file), where OLD / NEW are the buggy / fixed line of the task's gold patch without their common
indentation. It answers in vLLM's dialect through the same app as the model (prompt and completion token ids
from the served tokenizer, logprobs 0.0), so the proxy records expert demonstrations like any rollout.

On a ``locate`` task (its statement names the faulty line by its first words only) the expert takes three calls:
``grep -nF 'PREFIX' FILE`` (look the line up), ``sed -i 'Ns|OLD|NEW|' FILE`` (edit it by number), then
``python -c 'from m import f; assert CALL == EXPECTED' && echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` (check the
statement's example and submit); a prompt that already holds a step's command gets the next one.

In a tool-calling harness it calls the shell tool the prompt offers, each in its own argument shape
(:data:`SHELL_TOOLS`): ``bash`` {command} (mini-SWE-agent 2.x, OpenCode), ``terminal`` {command} (OpenHands),
``Bash`` {command} (Claude Code), ``run_shell_command`` {command} (Qwen Code), ``exec_command`` {cmd} (Codex CLI),
or ``shell`` {command: ["bash", "-lc", COMMAND]} (an argv: Codex's older shell tool; 0.169.0 does not offer it),
with any other required argument filled in. A step counts as issued when its command is in the prompt
JSON-escaped, which holds for a string argument and for an argv's last element alike. Once its commands were
issued, a harness that is not told to submit with the ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` sentinel
(OpenCode, OpenHands, the three CLIs) gets the end of the turn instead: a ``finish`` tool call where one is offered
(OpenHands), else a plain reply without a tool call, which ends a CLI's run (its exit 0).

A request's task is found by its problem statement, which the harness quotes verbatim: each task is indexed by
the statement line (after the first) that the fewest tasks share; a hit is confirmed when the whole statement
is in the decoded prompt. An unknown prompt, a task whose fix is not one changed line, and a prompt that
already holds the expert's command get the plain submit command.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shlex
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.tasks.blobs import buggy_files
from repro.tasks.schema import Task
from repro.tinymodel.vocab import SUBMIT_COMMAND, SUBMIT_SUFFIX

log = logging.getLogger(__name__)

TOOLS_OFFERED = "<tools>"  # the chat templates list offered tools inside <tools></tools>, one JSON a line
TOOLS_END = "</tools>"
# Each harness's shell tool -> the argument that takes the command, in order of preference: mini-SWE-agent 2.x and
# OpenCode: bash; OpenHands: terminal; Claude Code: Bash; Qwen Code: run_shell_command; Codex: exec_command (cmd), or
# an older Codex's shell, whose command is an argv (an array-typed argument gets ``bash -lc COMMAND``).
SHELL_TOOLS = {"bash": "command", "terminal": "command", "execute_bash": "command", "Bash": "command",
               "run_shell_command": "command", "exec_command": "cmd", "shell": "command"}
ARGV_SHELL = ("bash", "-lc")
FINISH_TOOL = "finish"
DONE_REPLY = "Done."
SUBMIT_SENTINEL = SUBMIT_COMMAND.removeprefix("echo ")
ASSISTANT_TURN = "<|im_start|>assistant"
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_BRE_SPECIAL = re.compile(r"([\\.*\[\]^$|])")
_REPLACEMENT_SPECIAL = re.compile(r"([\\&|])")


@dataclass(frozen=True)
class LineFix:
    """A gold patch that replaces one line: ``old`` (line ``lineno`` of ``path``, 1-based) becomes ``new``."""

    path: str
    lineno: int
    old: str
    new: str


def single_line_fix(patch: str) -> LineFix | None:
    """The fix of a one-file unified diff with exactly one removed and one added line, else None."""
    lines, path, removed, added, i = patch.splitlines(), None, [], [], 0
    while i < len(lines):
        line, i = lines[i], i + 1
        if line.startswith("+++ "):
            if path is not None:
                return None
            path = line[4:].removeprefix("b/")
        elif match := _HUNK.match(line):
            i = _read_hunk(lines, i, match, removed, added)
    if path is None or len(removed) != 1 or len(added) != 1:
        return None
    return LineFix(path, removed[0][0], removed[0][1], added[0])


def _read_hunk(lines: list[str], i: int, header: re.Match, removed: list[tuple[int, str]], added: list[str]) -> int:
    """Collect one hunk's removed (line number, text) and added lines; return the index after the hunk."""
    old_line, n_old, n_new = int(header[1]), int(header[2] or 1), int(header[3] or 1)
    while (n_old > 0 or n_new > 0) and i < len(lines):
        tag, text, i = lines[i][:1], lines[i][1:], i + 1
        if tag == "-":
            removed.append((old_line, text))
            old_line, n_old = old_line + 1, n_old - 1
        elif tag == "+":
            added.append(text)
            n_new -= 1
        elif tag != "\\":
            old_line, n_old, n_new = old_line + 1, n_old - 1, n_new - 1
    return i


def escape_bre(text: str) -> str:
    """``text`` as a literal in a sed basic regular expression delimited by ``|``."""
    return _BRE_SPECIAL.sub(r"\\\1", text)


def escape_replacement(text: str) -> str:
    """``text`` as a literal sed replacement delimited by ``|``."""
    return _REPLACEMENT_SPECIAL.sub(r"\\\1", text)


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def sed_command(fix: LineFix, file_text: str | None, by_number: bool = False, submit: bool = True) -> str:
    """The expert's edit; the line is addressed by number when ``by_number`` or ``old`` is not unique in
    ``file_text`` (or the file is unknown); ``submit``: chain the submit command."""
    old, new = fix.old, fix.new
    indent = _indent(old)
    if indent and new.startswith(indent):
        old, new = old[len(indent) :], new[len(indent) :]
    lines = file_text.splitlines() if file_text is not None else None
    unique = lines is not None and sum(old in line for line in lines) == 1
    address = str(fix.lineno) if by_number or not unique else ""
    script = f"{address}s|{escape_bre(old)}|{escape_replacement(new)}|"
    suffix = SUBMIT_SUFFIX if submit else ""
    return f"sed -i {shlex.quote(script)} {shlex.quote(command_path(fix.path))}{suffix}"


def locate_commands(fix: LineFix, file_text: str | None, prefix: str, check: str | None) -> list[str]:
    """Look the line up by ``prefix``, edit it by number, then run ``check`` (Python) and submit (without a check,
    the edit submits)."""
    look = f"grep -nF {shlex.quote(prefix)} {shlex.quote(command_path(fix.path))}"
    if check is None:
        return [look, sed_command(fix, file_text, by_number=True)]
    edit = sed_command(fix, file_text, by_number=True, submit=False)
    return [look, edit, f"python -c {shlex.quote(check)}{SUBMIT_SUFFIX}"]


_PREFIX = re.compile(r"on the line that starts with `([^`\n]+)`")


def command_path(path: str) -> str:
    """``./name.py`` for a relative path: after ``/`` the name tokenizes as it does in the statement (after a
    backtick, with no leading space); ``name.py`` after a space would be other tokens the model must map to."""
    return path if path.startswith(("/", "./", "../")) else f"./{path}"


def tool_call_text(command: str) -> str:
    """The completion that calls the ``bash`` tool with ``command`` (what a prompt that lists no shell tool gets), as
    the chat templates re-render a tool call."""
    return call_text(*shell_call([], command))


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """One Hermes ``<tool_call>`` block."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


def offered_tools(prompt: str) -> list[dict[str, Any]]:
    """The functions listed in a rendered prompt's ``<tools>`` block (one JSON object a line), unparsable lines
    skipped."""
    start = prompt.find(f"{TOOLS_OFFERED}\n")  # the block, not the instruction that names its tags
    end = prompt.find(f"\n{TOOLS_END}", start)
    if start < 0 or end < 0:
        return []
    tools = []
    for line in prompt[start + len(TOOLS_OFFERED):end].splitlines():
        try:
            tool = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(tool, dict):
            tools.append(tool.get("function", tool))
    return tools


def required_arguments(tool: dict[str, Any], given: tuple[str, ...]) -> dict[str, Any]:
    """Plain values for a tool's required parameters other than ``given``: an enum's first value, ``false``, 0, or a
    short text."""
    params = tool.get("parameters") or {}
    properties = params.get("properties") or {}
    filled: dict[str, Any] = {}
    for name in params.get("required") or []:
        if name in given:
            continue
        spec = properties.get(name) or {}
        kind = spec.get("type")
        filled[name] = spec["enum"][0] if spec.get("enum") else False if kind == "boolean" else \
            0 if kind in ("integer", "number") else "Apply the fix"
    return filled


def shell_call(tools: list[dict[str, Any]], command: str) -> tuple[str, dict[str, Any]]:
    """The offered shell tool's name (``bash`` when none is listed) and its arguments: ``command`` under the tool's
    command argument (as ``bash -lc COMMAND`` where that argument is an array), then the other required ones."""
    by_name = {t.get("name"): t for t in tools}
    name = next((n for n in SHELL_TOOLS if n in by_name), "bash")
    key, tool = SHELL_TOOLS[name], by_name.get(name)
    if tool is None:
        return name, {key: command}
    spec = ((tool.get("parameters") or {}).get("properties") or {}).get(key) or {}
    value = [*ARGV_SHELL, command] if spec.get("type") == "array" else command
    return name, {key: value, **required_arguments(tool, (key,))}


def end_of_turn(tools: list[dict[str, Any]]) -> str:
    """The completion that ends the agent's run in a harness without the submit sentinel: ``finish`` when offered,
    else a plain reply (no tool call)."""
    finish = next((t for t in tools if t.get("name") == FINISH_TOOL), None)
    if finish is None:
        return DONE_REPLY
    return call_text(FINISH_TOOL, {"message": DONE_REPLY} | required_arguments(finish, ("message",)))


def submits_by_sentinel(prompt: str) -> bool:
    """Whether the harness's instructions (the prompt before the first assistant turn) name the submit sentinel."""
    return SUBMIT_SENTINEL in prompt.split(ASSISTANT_TURN, 1)[0]


def text_action(command: str) -> str:
    """The completion that runs ``command`` in a text-mode harness: one ``bash`` code block."""
    return f"```bash\n{command}\n```"


def procedure(task: Task, fix: LineFix | None, file_text: str | None) -> list[str]:
    """The scripted commands for one task, in order: the plain submit when there is no one-line fix, or when the
    file at the base commit does not hold the patch's line (an inconsistent task); the three ``locate`` calls
    when the statement names the line by its first words; else the one edit-and-submit."""
    if fix is None:
        return [SUBMIT_COMMAND]
    lines = file_text.splitlines() if file_text is not None else None
    if lines is not None and (len(lines) < fix.lineno or lines[fix.lineno - 1] != fix.old):
        return [SUBMIT_COMMAND]
    prefix = _PREFIX.search(task.problem_statement) if task.difficulty == "locate" else None
    if prefix is not None:
        return locate_commands(fix, file_text, prefix[1], task.extra.get("check"))
    return [sed_command(fix, file_text)]


def slipped(instance_id: str, rate: float, seed: int = 0) -> bool:
    """Whether the expert slips on this task: a fixed, seeded draw per instance (share ``rate`` of the tasks)."""
    if rate <= 0:
        return False
    draw = int(hashlib.sha256(f"{seed}:{instance_id}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return draw < rate


def _may_slip(task: Task, operators: tuple[str, ...]) -> bool:
    return not operators or task.operator in operators


def slip(command: str) -> str:
    """The slipped command: ``sed -n`` (print nothing) typed for ``sed -i`` (edit in place). It still exits 0 and
    submits in the same call, but the file is unchanged."""
    return "sed -n " + command[len("sed -i "):] if command.startswith("sed -i ") else command


class ExpertScript:
    """Statement -> command table of a task set, looked up in decoded prompts.

    ``slip_rate``: the share of tasks (a seeded draw per instance, :func:`slipped`) on which the expert types
    ``sed -n`` for ``sed -i``: an imperfect demonstrator, whose habit SFT copies and RL can remove.
    ``slip_operators``: only tasks whose bug was made by one of these mutation operators (``Task.operator``) can
    slip (empty: any task): a systematic blind spot, which a model copies onto unseen tasks of that kind."""

    def __init__(self, tasks: list[Task], slip_rate: float = 0.0, slip_seed: int = 0,
                 slip_operators: tuple[str, ...] = ()) -> None:
        fixes = [single_line_fix(t.patch) for t in tasks]
        files = buggy_files((t, fix.path) for t, fix in zip(tasks, fixes, strict=True) if fix)
        self.statements = [t.problem_statement for t in tasks]
        procedures = [procedure(t, fix, files.get((t.base_commit, fix.path)) if fix else None)
                      for t, fix in zip(tasks, fixes, strict=True)]
        self.procedures = [[slip(c) for c in p] if _may_slip(t, slip_operators)
                           and slipped(t.instance_id, slip_rate, slip_seed) else p
                           for t, p in zip(tasks, procedures, strict=True)]
        self.n_scripted = sum(p != [SUBMIT_COMMAND] for p in self.procedures)
        inconsistent = sum(fix is not None and p == [SUBMIT_COMMAND]
                           for fix, p in zip(fixes, self.procedures, strict=True))
        if inconsistent:
            log.warning("expert: %d task(s) whose base commit does not hold their gold patch's line get the plain "
                        "submit", inconsistent)
        self._index: dict[str, list[int]] = defaultdict(list)
        self._unindexed: list[int] = []
        lines = [[s.strip() for s in text.splitlines()[1:] if s.strip()] for text in self.statements]
        counts = Counter(line for task_lines in lines for line in set(task_lines))
        for i, task_lines in enumerate(lines):
            if task_lines:
                self._index[min(task_lines, key=lambda s: (counts[s], -len(s)))].append(i)
            else:
                self._unindexed.append(i)

    @classmethod
    def from_jsonl(cls, path: Path, slip_rate: float = 0.0, slip_seed: int = 0,
                   slip_operators: tuple[str, ...] = ()) -> ExpertScript:
        """The script of a JSONL file of :class:`Task` rows."""
        with open(path, encoding="utf-8") as f:
            tasks = [Task.from_row(json.loads(line)) for line in f if line.strip()]
        return cls(tasks, slip_rate, slip_seed, slip_operators)

    def find(self, prompt: str) -> int | None:
        """Index of the task whose statement the prompt quotes, or None."""
        candidates = [i for line in prompt.splitlines() for i in self._index.get(line.strip(), ())]
        for i in [*candidates, *self._unindexed]:
            if self.statements[i] in prompt:
                return i
        return None

    @property
    def commands(self) -> list[str]:
        """Each task's first scripted command."""
        return [p[0] for p in self.procedures]

    def command(self, prompt: str, text_mode: bool = False) -> str:
        """The command to answer ``prompt`` with: the task's first scripted command the prompt does not hold yet
        (the plain submit once all were issued); a tool call's command sits in the prompt JSON-escaped, a text-mode
        action's as it is."""
        i = self.find(prompt)
        if i is None:
            return SUBMIT_COMMAND
        quoted = (lambda c: c) if text_mode else (lambda c: json.dumps(c, ensure_ascii=False)[1:-1])
        issued = (c for c in self.procedures[i] if quoted(c) not in prompt)
        return next(issued, SUBMIT_COMMAND)

    def completion(self, prompt: str) -> str:
        """The completion text for a decoded prompt: :meth:`command` as one call of the offered shell tool when the
        prompt offers tools (:func:`end_of_turn` once done, where the harness has no submit sentinel), else (a
        text-mode harness such as mini-SWE-agent 1.x) as one ```` ```bash ```` block."""
        if TOOLS_OFFERED not in prompt:
            return text_action(self.command(prompt, text_mode=True))
        tools, command = offered_tools(prompt), self.command(prompt)
        if command == SUBMIT_COMMAND and not submits_by_sentinel(prompt):
            return end_of_turn(tools)
        return call_text(*shell_call(tools, command))


def serving_script(tasks_jsonl: Path, slip_rate: float = 0.0, slip_seed: int = 0,
                   slip_operators: tuple[str, ...] = ()) -> Callable[[str], str]:
    """The expert's completions (decoded prompt -> text) for the tasks of a JSONL file: what the CPU server's scripted
    engine answers with under ``--expert-tasks`` (it loads this function by name, ``EXPERT_SCRIPT``)."""
    script = ExpertScript.from_jsonl(Path(tasks_jsonl), slip_rate, slip_seed, slip_operators)
    log.info("expert: %d tasks, %d with a one-line fix", len(script.commands), script.n_scripted)
    return script.completion

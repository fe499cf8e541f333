"""The scripted expert: the sed command of a gold one-line fix, its escaping, the prompt lookup, the engine."""

from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from repro.common.net import free_port
from repro.sandbox.local import LocalSandbox, LocalSandboxConfig
from repro.serving.cpu_server import ServerConfig, create_app
from repro.serving.engine import EngineConfig
from repro.serving.tool_parser import parse_tool_calls
from repro.tasks.blobs import buggy_files
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.tasks.schema import Task
from repro.testing import ServerThread
from repro.tinymodel.expert import (
    ExpertScript,
    LineFix,
    sed_command,
    single_line_fix,
    slip,
    slipped,
    tool_call_text,
)
from repro.tinymodel.model import TinyModelConfig, build_tiny_model
from repro.tinymodel.recipe import recipe_corpus
from repro.tinymodel.vocab import SUBMIT_COMMAND, render_chat

SUBMIT_LINE = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
RECIPE_TASKS = TaskDistributionConfig(seed=0, split="test", n_tasks=4, families=["procedural"], operators=["recipe"],
                                      difficulty="one_step")
BASH_TOOL = {"type": "function", "function": {
    "name": "bash", "description": "Execute a bash command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
INSTANCE_TAIL = "\n\nYou can execute bash commands and edit files to implement the necessary changes.\n\n## Rules"


def mini_messages(statement: str) -> list[dict[str, Any]]:
    """A first request shaped like mini-SWE-agent's (system prompt, instance template around the task)."""
    return [{"role": "system", "content": "You are a helpful assistant that can interact with a computer."},
            {"role": "user", "content": f"Please solve this issue: {statement}{INSTANCE_TAIL}"}]


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    return build_distribution(RECIPE_TASKS)


@pytest.fixture(scope="module")
def tasks_jsonl(tasks: list[Task], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("expert") / "tasks.jsonl"
    path.write_text("".join(json.dumps(t.to_row()) + "\n" for t in tasks))
    return path


def run_bash(command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=30)


def test_gold_patch_is_one_line_fix_at_its_line(tasks: list[Task]) -> None:
    for task in tasks:
        fix = single_line_fix(task.patch)
        assert fix is not None, task.instance_id
        text = buggy_files([(task, fix.path)])[(task.base_commit, fix.path)]
        assert text is not None and text.splitlines()[fix.lineno - 1] == fix.old
        assert fix.old.strip() in task.problem_statement  # the statement quotes the faulty line


def test_sed_command_resolves_the_task(tasks: list[Task]) -> None:
    sandbox = LocalSandbox(LocalSandboxConfig())
    script = ExpertScript(tasks)
    try:
        for task in tasks:
            command = script.command(render_chat(mini_messages(task.problem_statement), [BASH_TOOL], True))
            assert command.startswith("sed -i 's|") and command.endswith(" && echo " + SUBMIT_LINE), command
            workspace = sandbox.workspace(task, f"expert-{task.instance_id}")
            result = run_bash(command, workspace.path)
            assert result.returncode == 0 and result.stdout.splitlines()[0] == SUBMIT_LINE, result.stderr
            assert sandbox.grade(task, workspace).outcome == "resolved", (task.instance_id, command)
            workspace.cleanup()
    finally:
        sandbox.close()


def test_slipped_expert_types_sed_n_and_leaves_the_bug(tasks: list[Task]) -> None:
    """A slipped command exits 0 and submits in the same call, but edits nothing: the task stays unresolved."""
    sandbox = LocalSandbox(LocalSandboxConfig())
    script = ExpertScript(tasks, slip_rate=1.0)
    try:
        task = tasks[0]
        command = script.command(render_chat(mini_messages(task.problem_statement), [BASH_TOOL], True))
        assert command.startswith("sed -n '"), command
        workspace = sandbox.workspace(task, f"slip-{task.instance_id}")
        result = run_bash(command, workspace.path)
        assert result.returncode == 0 and result.stdout.splitlines()[0] == SUBMIT_LINE
        assert workspace.diff() == ""
        assert sandbox.grade(task, workspace).outcome == "unresolved"
        workspace.cleanup()
    finally:
        sandbox.close()


def test_slip_can_be_limited_to_mutation_operators(tasks: list[Task]) -> None:
    own = tuple({t.operator for t in tasks})
    assert all(c.startswith("sed -n ") for c in ExpertScript(tasks, 1.0, slip_operators=own).commands)
    assert not any(c.startswith("sed -n ") for c in ExpertScript(tasks, 1.0, slip_operators=("nope",)).commands)


def test_slip_draw_is_seeded_per_instance_and_hits_its_rate() -> None:
    ids = [f"task-{i}" for i in range(4000)]
    share = sum(slipped(i, 0.4) for i in ids) / len(ids)
    assert 0.37 < share < 0.43
    assert [slipped(i, 0.4) for i in ids] == [slipped(i, 0.4) for i in ids]
    assert [slipped(i, 0.4, seed=1) for i in ids] != [slipped(i, 0.4) for i in ids]
    assert not any(slipped(i, 0.0) for i in ids)
    assert slip("sed -i '3s|a|b|' ./x.py && echo done") == "sed -n '3s|a|b|' ./x.py && echo done"
    assert slip("echo COMPLETE") == "echo COMPLETE"


@pytest.mark.parametrize("old, new", [
    ("x = a.b[0] * c ^ $d", "x = a.b[0] / c ^ $d"),
    (r"s = 'it''s' + r'\d|\w' & 1", r"s = 'it''s' - r'\d|\w' & 1"),
    ("return x*2 | y", "return x*3 | y & z"),
])
def test_escaping_for_sed_bre_and_replacement(tmp_path: Path, old: str, new: str) -> None:
    lines = ["def f():", f"    {old}", "    pass", ""]
    (tmp_path / "m.py").write_text("\n".join(lines))
    command = sed_command(LineFix("m.py", 2, f"    {old}", f"    {new}"), "\n".join(lines))
    assert not command.startswith("sed -i '2")  # unique: no line address
    assert run_bash(command, tmp_path).returncode == 0
    assert (tmp_path / "m.py").read_text() == "\n".join(["def f():", f"    {new}", "    pass", ""])


def test_line_that_is_not_unique_is_addressed_by_number(tmp_path: Path) -> None:
    lines = ["x = 1 + 2", "    x = 1 + 2", "y = x", "  x = 1 + 2 + 3", ""]
    (tmp_path / "m.py").write_text("\n".join(lines))
    command = sed_command(LineFix("m.py", 2, "    x = 1 + 2", "    x = 1 - 2"), "\n".join(lines))
    assert command.startswith("sed -i '2s|x = 1 + 2|x = 1 - 2|' ./m.py")
    assert run_bash(command, tmp_path).stdout == SUBMIT_LINE + "\n"
    assert (tmp_path / "m.py").read_text().splitlines() == ["x = 1 + 2", "    x = 1 - 2", "y = x", "  x = 1 + 2 + 3"]
    unknown_file = sed_command(LineFix("m.py", 4, "  x = 1 + 2 + 3", "  x = 1 + 2 - 3"), None)
    assert unknown_file.startswith("sed -i '4s|")


def test_task_whose_commit_lacks_the_patched_line_gets_the_plain_submit(tasks: list[Task]) -> None:
    fix = single_line_fix(tasks[0].patch)
    broken = replace(tasks[0], patch=tasks[0].patch.replace(f"-{fix.old}\n", f"-{fix.old} + 0\n"))
    assert single_line_fix(broken.patch).old == fix.old + " + 0"
    script = ExpertScript([broken, tasks[1]])
    assert script.commands[0] == SUBMIT_COMMAND and script.commands[1].startswith("sed -i")
    assert script.n_scripted == 1


def test_patches_that_are_not_one_line_are_not_scripted() -> None:
    two = "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n-a\n-b\n+c\n+d\n"
    added = "--- a/m.py\n+++ b/m.py\n@@ -1,1 +1,2 @@\n a\n+b\n"
    assert single_line_fix(two) is None and single_line_fix(added) is None and single_line_fix("") is None
    assert single_line_fix("--- a/m.py\n+++ b/m.py\n@@ -3,3 +3,3 @@\n a\n--- x\n+++ y\n b\n") == \
        LineFix("m.py", 4, "-- x", "++ y")


def test_script_finds_the_task_only_in_its_own_prompt(tasks: list[Task]) -> None:
    script = ExpertScript(tasks)
    commands = [script.command(render_chat(mini_messages(t.problem_statement), [BASH_TOOL], True)) for t in tasks]
    assert len(set(commands)) == len(tasks) and SUBMIT_COMMAND not in commands
    assert script.command(render_chat(mini_messages("Something else is broken."), [BASH_TOOL], True)) == SUBMIT_COMMAND
    done = [*mini_messages(tasks[0].problem_statement),
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": commands[0]})}}]},
            {"role": "tool", "content": "oops"}]
    assert script.command(render_chat(done, [BASH_TOOL], True)) == SUBMIT_COMMAND  # never the same fix twice


@pytest.fixture(scope="module")
def expert_url(tasks: list[Task], tasks_jsonl: Path, tmp_path_factory: pytest.TempPathFactory):
    model_dir = build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", TinyModelConfig(vocab_size=600),
                                 recipe_corpus(tasks))
    app = create_app(ServerConfig(EngineConfig(model_dir), served_model_name="tiny", expert_tasks=tasks_jsonl))
    with ServerThread(app, free_port()) as server:
        yield server.url, AutoTokenizer.from_pretrained(model_dir)


def test_expert_server_answers_the_tool_call(expert_url, tasks: list[Task]) -> None:
    url, tokenizer = expert_url
    script = ExpertScript(tasks)
    for task in tasks[:2]:
        messages = mini_messages(task.problem_statement)
        body = {"model": "tiny", "messages": messages, "tools": [BASH_TOOL], "return_token_ids": True,
                "logprobs": True}
        out = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
        choice = out["choices"][0]
        command = json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"])["command"]
        assert command == script.command(render_chat(messages, [BASH_TOOL], True))
        assert choice["finish_reason"] == "tool_calls"
        expected = [*tokenizer.encode(tool_call_text(command), add_special_tokens=False), tokenizer.eos_token_id]
        assert choice["token_ids"] == expected
        assert [e["logprob"] for e in choice["logprobs"]["content"]] == [0.0] * len(expected)
        assert out["prompt_token_ids"] == tokenizer.apply_chat_template(
            messages, tools=[BASH_TOOL], add_generation_prompt=True, tokenize=True, return_dict=False)


def test_expert_server_honours_max_tokens_and_streams(expert_url, tasks: list[Task]) -> None:
    url, _ = expert_url
    body = {"model": "tiny", "messages": mini_messages(tasks[0].problem_statement), "tools": [BASH_TOOL]}
    short = httpx.post(f"{url}/v1/chat/completions", json={**body, "max_tokens": 3}, timeout=60).json()
    assert short["choices"][0]["finish_reason"] == "length" and short["usage"]["completion_tokens"] == 3
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=60) as resp:
        events = [line for line in resp.iter_lines() if line.startswith("data: {")]
    calls = [c for e in events for c in json.loads(e[6:])["choices"][0]["delta"].get("tool_calls", [])]
    assert len(calls) == 1 and "sed -i" in calls[0]["function"]["arguments"]


def test_locate_procedure_answers_the_first_step_the_prompt_lacks() -> None:
    tasks = build_distribution(replace(RECIPE_TASKS, difficulty="locate", n_tasks=2))
    script, slipping = ExpertScript(tasks), ExpertScript(tasks, slip_rate=1.0)
    prompt = render_chat(mini_messages(tasks[0].problem_statement))
    look, edit, check = script.procedures[0]
    assert look.startswith("grep -nF '") and edit.startswith(f"sed -i '{tasks[0].extra['line']}s|")
    assert check == f"python -c {shlex.quote(tasks[0].extra['check'])} && echo {SUBMIT_LINE}"
    steps = []
    for _ in range(4):
        steps.append(script.command(prompt))
        prompt += "\n" + tool_call_text(steps[-1])
    assert steps == [look, edit, check, SUBMIT_COMMAND]
    assert slipping.procedures[0] == [look, "sed -n " + edit[len("sed -i "):], check]  # only the edit slips


def tool(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": name, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


TERMINAL = tool("terminal", {"command": {"type": "string"}, "is_input": {"type": "boolean"},
                             "security_risk": {"type": "string", "enum": ["LOW", "HIGH"]}},
                ["command", "security_risk"])
FINISH = tool("finish", {"message": {"type": "string"}}, ["message"])
EDITOR = tool("file_editor", {"path": {"type": "string"}}, ["path"])


def calls_of(completion: str) -> list[tuple[str, dict[str, Any]]]:
    """The (name, arguments) of each tool call the Hermes parser finds in a completion."""
    _, calls = parse_tool_calls(completion)
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def after_call(messages: list[dict[str, Any]], name: str, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    return [*messages, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]},
        {"role": "tool", "content": "done"}]


def test_expert_calls_the_offered_shell_tool_then_finishes(tasks: list[Task]) -> None:
    """OpenHands-like: ``terminal`` with its required arguments, then ``finish`` once the fix was issued."""
    script, tools = ExpertScript(tasks), [EDITOR, TERMINAL, FINISH]
    messages = mini_messages(tasks[0].problem_statement)
    [(name, args)] = calls_of(script.completion(render_chat(messages, tools, True)))
    assert name == "terminal" and args == {"command": script.commands[0], "security_risk": "LOW"}
    done = after_call(messages, name, args)
    assert calls_of(script.completion(render_chat(done, tools, True))) == [("finish", {"message": "Done."})]


def test_expert_ends_with_a_plain_reply_without_finish_or_sentinel(tasks: list[Task]) -> None:
    """OpenCode-like (bash, no finish, no submit sentinel in the instructions): a reply without a tool call."""
    script = ExpertScript(tasks)
    messages = mini_messages(tasks[1].problem_statement)
    [(name, args)] = calls_of(script.completion(render_chat(messages, [BASH_TOOL, EDITOR], True)))
    assert (name, args) == ("bash", {"command": script.commands[1]})
    done = script.completion(render_chat(after_call(messages, name, args), [BASH_TOOL, EDITOR], True))
    assert done == "Done." and calls_of(done) == []


def test_expert_submits_by_sentinel_where_the_instructions_name_it(tasks: list[Task]) -> None:
    """mini-SWE-agent-like (its instructions name the sentinel): the plain submit command, as before."""
    script = ExpertScript(tasks)
    messages = mini_messages(tasks[2].problem_statement)
    messages[1]["content"] += f"\nWhen done, run `echo {SUBMIT_LINE}`."
    done = after_call(messages, "bash", {"command": script.commands[2]})
    assert calls_of(script.completion(render_chat(done, [BASH_TOOL], True))) == [("bash", {"command": SUBMIT_COMMAND})]


STRING, FLAG = {"type": "string"}, {"type": "boolean"}
# Each CLI's shell tool as it lists it (the arguments that matter), beside another of its tools; the key that takes the
# command; how that command runs (a string through ``bash -c``, an argv as it is).
CLI_SHELLS = {
    "claude-code": ([tool("Bash", {"command": STRING, "timeout": {"type": "number"}, "description": STRING,
                                   "run_in_background": FLAG}, ["command"]),
                     tool("Edit", {"file_path": STRING, "old_string": STRING}, ["file_path", "old_string"])],
                    "Bash", "command"),
    "codex": ([tool("exec_command", {"cmd": STRING, "workdir": STRING, "login": FLAG, "tty": FLAG}, ["cmd"]),
               tool("write_stdin", {"session_id": {"type": "number"}, "chars": STRING}, ["session_id"])],
              "exec_command", "cmd"),
    "codex-argv": ([tool("shell", {"command": {"type": "array", "items": STRING}, "workdir": STRING,
                                   "timeout_ms": {"type": "number"}}, ["command"])], "shell", "command"),
    "qwen-code": ([tool("edit", {"file_path": STRING}, ["file_path"]),
                   tool("run_shell_command", {"command": STRING, "is_background": FLAG, "description": STRING},
                        ["command"])], "run_shell_command", "command"),
}


@pytest.mark.parametrize("cli", sorted(CLI_SHELLS))
def test_expert_calls_each_clis_shell_tool_in_its_shape_and_resolves(cli: str) -> None:
    """Claude Code's ``Bash`` {command}, Codex's ``exec_command`` {cmd} (or an argv ``shell``: bash -lc COMMAND), Qwen
    Code's ``run_shell_command`` {command}: each step once, in order (the prompt holds the calls the CLI re-sent),
    then a plain reply; the calls, run as the CLI runs them, resolve the task."""
    tasks = build_distribution(replace(RECIPE_TASKS, difficulty="locate", n_tasks=1))
    script, (tools, name, key) = ExpertScript(tasks), CLI_SHELLS[cli]
    messages, sandbox = mini_messages(tasks[0].problem_statement), LocalSandbox(LocalSandboxConfig())
    try:
        workspace = sandbox.workspace(tasks[0], f"cli-{cli}")
        for command in script.procedures[0]:
            [(called, args)] = calls_of(script.completion(render_chat(messages, tools, True)))
            argv = ["bash", "-lc", command] if cli == "codex-argv" else ["bash", "-c", command]
            assert (called, args) == (name, {key: argv if cli == "codex-argv" else command})
            result = subprocess.run(argv, cwd=workspace.path, capture_output=True, text=True, timeout=30)
            assert result.returncode == 0, result.stderr
            messages = after_call(messages, called, args)
        done = script.completion(render_chat(messages, tools, True))
        assert done == "Done." and calls_of(done) == []
        assert sandbox.grade(tasks[0], workspace).outcome == "resolved"
        workspace.cleanup()
    finally:
        sandbox.close()

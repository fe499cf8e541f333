"""Fixed texts from captured requests: what every request repeats, without the day's date or a rollout's own text;
the tools when all requests offer the same, else the lines of the tools block they share."""

from __future__ import annotations

import datetime as dt

from repro.recipe.harness_texts import fixed_texts, message_text
from repro.tinymodel.vocab import recipe_added_tokens

DAY = dt.date(2026, 12, 6)
SYSTEM = "You are a careful coding agent with tools.\n\nAlways run the tests after an edit.\n\nToday is 2026-12-06."
PARAMETERS = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
BASH = {"type": "function", "function": {"name": "bash", "description": "Run a shell command in the repository.",
                                          "parameters": PARAMETERS}}


def _request(task: str, editor_root: str) -> dict:
    editor = {"type": "function", "function": {"name": "edit", "description": f"Edit files under {editor_root} only.",
                                               "parameters": {"type": "object",
                                                              "properties": {"path": {"type": "string"}}}}}
    return {"messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": [{"type": "text", "text": f"<task>\n\n{task}\n\nEnd of task."}]}],
            "tools": [BASH, editor]}


def test_fixed_texts_are_what_every_request_repeats() -> None:
    same_tools = [dict(_request("Fix the sum in calc.py please.", "/w"), tools=[BASH]),
                  dict(_request("The parser drops the last token.", "/w"), tools=[BASH])]
    captured = fixed_texts(same_tools, DAY)
    assert captured.fixed_prompt_texts() == ["Always run the tests after an edit.", "End of task.",
                                             "You are a careful coding agent with tools."]
    assert "Today is 2026-12-06." not in captured.fixed_prompt_texts()  # the day's date is not fixed
    assert not any("calc.py" in t or "parser" in t for t in captured.fixed_prompt_texts())  # nor the task
    assert captured.tools() == [BASH]
    assert message_text(same_tools[0]["messages"][1]).startswith("<task>")


def test_tools_that_name_a_rollouts_own_path_give_the_lines_they_share() -> None:
    differing = [_request("Fix the sum in calc.py please.", "/tmp/ws-1"),
                 _request("The parser drops the last token.", "/tmp/ws-2")]
    captured = fixed_texts(differing, DAY)
    assert captured.tools() == []  # no single tools block repeats
    texts = captured.fixed_prompt_texts()
    bash_line = next(t for t in texts if t.startswith('{"type": "function", "function": {"name": "bash"'))
    assert "/tmp/ws-" not in "".join(texts) and bash_line.endswith("}}")
    assert any(t.startswith('<tool_call>\n{"name": "edit", "arguments": {"path": "') for t in texts)
    assert set(texts) <= set(recipe_added_tokens(texts, captured.tools()))


def test_a_paragraph_holding_a_rollouts_path_gives_its_whole_words_around_the_path() -> None:
    env = "Here is useful information about the environment you run in:\nWorking directory: {}\nPlatform: linux"
    requests = [{"messages": [{"role": "system", "content": env.format(path)}]}
                for path in ("/tmp/repro-workspaces-ab12/run-1", "/tmp/repro-workspaces-cd34/run-2")]
    texts = fixed_texts(requests, DAY).fixed_prompt_texts()
    assert texts == ["Here is useful information about the environment you run in:\nWorking directory:"]

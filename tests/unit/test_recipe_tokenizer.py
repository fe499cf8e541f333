"""The recipe tokenizer: fixed template texts as single added tokens, round trips through the chat template,
and a code line that tokenizes the same in the statement and in the expert's command."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import jinja2
import pytest
from transformers import AutoTokenizer

from harness_adapters.template_texts import fixed_template_texts, template_literals
from repro.serving.tool_parser import parse_tool_calls
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.tinymodel.expert import ExpertScript, single_line_fix, tool_call_text
from repro.tinymodel.model import TinyModelConfig, build_tiny_model, config_dict
from repro.tinymodel.recipe import recipe_corpus, resolve_model_config
from repro.tinymodel.vocab import (
    SUBMIT_SUFFIX,
    recipe_added_tokens,
    render_chat,
    tool_call_pieces,
    tools_block_texts,
)

BASH_TOOL = {"type": "function", "function": {
    "name": "bash", "description": "Execute a bash command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string", "description": "The command"}},
                   "required": ["command"]}}}
SYSTEM = "You are a helpful assistant that can interact with a computer."
# Shaped like mini-SWE-agent's instance template: a variable, paragraphs, whitespace control around a branch.
INSTANCE = """Please solve this issue: {{task}}

You can execute bash commands and edit files to implement the necessary changes.

## Recommended Workflow

1. Analyze the codebase
2. Submit with `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`.

### Edit files with sed:

{%- if system == "Darwin" -%}
<important>
You are on MacOS: use `sed -i ''`.
</important>
{%- endif -%}

```bash
sed -i 's/old_string/new_string/g' filename.py
```
"""
TASKS = TaskDistributionConfig(seed=0, split="train", n_tasks=12, families=["procedural"], operators=["recipe"],
                               difficulty="one_step")
BRE_SPECIAL = re.compile(r"[\\.*\[\]^$|&']")


def render(source: str, **variables: Any) -> str:
    return jinja2.Template(source, undefined=jinja2.StrictUndefined).render(**variables)


def test_template_texts_follow_whitespace_control() -> None:
    pieces = fixed_template_texts([INSTANCE, SYSTEM])
    assert pieces == sorted(set(pieces))
    assert "### Edit files with sed:" in pieces  # rstripped by `{%-`
    assert "```bash\nsed -i 's/old_string/new_string/g' filename.py\n```" in pieces  # lstripped by `-%}`
    assert "Please solve this issue:" in pieces and SYSTEM in pieces
    assert all(len(p) >= 12 and p == p.strip() for p in pieces)
    for system in ("Linux", "Darwin"):
        text = render(INSTANCE, task="X", system=system)
        assert all(p in text for p in pieces if "MacOS" not in p and p != SYSTEM)
    assert template_literals("a {{ b }}\n\n{%- if c %}d{% endif %}") == ["a ", "d"]


def test_tool_call_pieces_match_the_parser_and_the_template() -> None:
    opening, closing = tool_call_pieces()
    assert (opening, closing) == ('<tool_call>\n{"name": "bash", "arguments": {"command": "', '"}}\n</tool_call>')
    command = "sed -i 's|a \\\\* \"b\"|c|' m.py" + SUBMIT_SUFFIX
    text = tool_call_text(command)
    assert text == opening + json.dumps(command)[1:-1] + closing
    _, calls = parse_tool_calls(text)
    assert json.loads(calls[0]["function"]["arguments"]) == {"command": command}
    turn = render_chat([{"role": "user", "content": "u"}, {"role": "assistant", "content": None, "tool_calls": calls}])
    assert "<|im_start|>assistant\n" + text + "<|im_end|>" in turn


def test_recipe_tokens_are_sorted_and_include_every_kind() -> None:
    harness = fixed_template_texts([INSTANCE, SYSTEM])
    tokens = recipe_added_tokens(harness, [BASH_TOOL])
    assert tokens == sorted(set(tokens))
    assert set(harness) <= set(tokens) and SUBMIT_SUFFIX in tokens and set(tool_call_pieces()) <= set(tokens)
    (block,) = tools_block_texts([BASH_TOOL])
    assert block in tokens and block.startswith("# Tools") and json.dumps(BASH_TOOL) in block
    assert recipe_added_tokens(harness, []) == sorted({*harness, SUBMIT_SUFFIX})


def test_default_model_config_is_unchanged() -> None:
    assert "recipe_tokens" not in config_dict(TinyModelConfig())
    assert resolve_model_config(TinyModelConfig(), harness=None) == TinyModelConfig()
    with pytest.raises(ValueError, match="recipe_tokens is set but not resolved"):
        build_tiny_model(Path("/nonexistent"), TinyModelConfig(recipe_tokens=True), [])


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list, list[str]]:
    tasks = build_distribution(TASKS)
    tokens = recipe_added_tokens(fixed_template_texts([INSTANCE, SYSTEM]), [BASH_TOOL])
    config = TinyModelConfig(vocab_size=1024, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                             intermediate_size=64, extra_added_tokens=tokens)
    model_dir = build_tiny_model(tmp_path_factory.mktemp("recipe") / "m", config, recipe_corpus(tasks))
    return AutoTokenizer.from_pretrained(model_dir), tasks, tokens


def first_messages(statement: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": render(SYSTEM)},
            {"role": "user", "content": render(INSTANCE, task=statement, system="Linux")}]


def test_added_tokens_are_single_ids_in_sorted_order(recipe) -> None:
    tokenizer, _, tokens = recipe
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in tokens]
    assert all(len(i) == 1 for i in ids)
    assert [i[0] for i in ids] == sorted(i[0] for i in ids)


def test_prompt_round_trips_and_is_short(recipe) -> None:
    tokenizer, tasks, _ = recipe
    for task in tasks[:4]:
        messages = first_messages(task.problem_statement)
        text = render_chat(messages, [BASH_TOOL], True)
        ids = tokenizer.apply_chat_template(messages, tools=[BASH_TOOL], add_generation_prompt=True, tokenize=True,
                                            return_dict=False)
        assert ids == tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids, skip_special_tokens=False) == text
        statement_ids = tokenizer.encode(task.problem_statement, add_special_tokens=False)
        assert len(ids) < len(statement_ids) + 40  # the template costs a few tokens, the tools block one


def test_completion_is_re_rendered_with_the_same_ids(recipe) -> None:
    """The next prompt starts with prompt + completion (eos included): nothing is re-tokenized differently."""
    tokenizer, tasks, _ = recipe
    script = ExpertScript(tasks)
    messages = first_messages(tasks[0].problem_statement)
    prompt = tokenizer.apply_chat_template(messages, tools=[BASH_TOOL], add_generation_prompt=True, tokenize=True,
                                           return_dict=False)
    text = tool_call_text(script.command(render_chat(messages, [BASH_TOOL], True)))
    completion = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    assert tokenizer.convert_ids_to_tokens(completion[:1]) == [tool_call_pieces()[0]]
    assert tokenizer.convert_ids_to_tokens(completion[-3:-1]) == [SUBMIT_SUFFIX, tool_call_pieces()[1]]
    _, calls = parse_tool_calls(text)
    turn = [{"role": "assistant", "content": None, "tool_calls": calls}, {"role": "tool", "content": "ok"}]
    following = tokenizer.apply_chat_template(messages + turn, tools=[BASH_TOOL], add_generation_prompt=True,
                                              tokenize=True, return_dict=False)
    assert following[: len(prompt) + len(completion)] == prompt + completion


def test_faulty_line_tokenizes_the_same_in_statement_and_command(recipe) -> None:
    tokenizer, tasks, _ = recipe
    script = ExpertScript(tasks)
    checked = 0
    for task in tasks:
        line = single_line_fix(task.patch).old.strip()
        if BRE_SPECIAL.search(line):
            continue  # escaped in the command (e.g. `\\*`)
        line_ids = tokenizer.encode(line, add_special_tokens=False)
        statement = tokenizer.encode(task.problem_statement, add_special_tokens=False)
        command = tokenizer.encode(tool_call_text(script.command(render_chat(first_messages(task.problem_statement),
                                                                              [BASH_TOOL], True))),
                                   add_special_tokens=False)
        for ids in (statement, command):
            assert any(ids[i : i + len(line_ids)] == line_ids for i in range(len(ids))), (line, task.instance_id)
        checked += 1
    assert checked >= 3


def test_recipe_config_resolves_from_harness_texts(monkeypatch: pytest.MonkeyPatch) -> None:
    import harness_adapters.mini_swe_agent.adapter as mini

    monkeypatch.setattr(mini, "fixed_prompt_texts", lambda cfg, platform_line: ["A fixed paragraph of text."])
    monkeypatch.setattr(mini, "harness_tools", lambda cfg: [BASH_TOOL])
    resolved = resolve_model_config(TinyModelConfig(recipe_tokens=True, extra_added_tokens=["zz own"]),
                                    mini.MiniSweAgentConfig())
    assert not resolved.recipe_tokens
    assert resolved.extra_added_tokens == sorted({"zz own", *recipe_added_tokens(["A fixed paragraph of text."],
                                                                                  [BASH_TOOL])})
    assert resolve_model_config(resolved, None) == resolved
    with pytest.raises(ValueError, match="mini-SWE-agent only"):
        resolve_model_config(replace(resolved, recipe_tokens=True), object())

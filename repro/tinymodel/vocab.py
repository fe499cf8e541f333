"""The recipe vocabulary: fixed texts that become single added tokens of the tiny model's tokenizer.

What a rollout's prompt and answer repeat verbatim is one token each: every fixed paragraph of the harness's
templates (its config's ``fixed_prompt_texts``, see :mod:`harness_adapters.template_texts`), the fixed part of our
chat template's tools block for the given tools (:func:`tools_block_texts`), the tool-call wrapper around a ``bash``
command (:func:`tool_call_pieces`) and the submit suffix. Everything else (task statements, code, commands) goes
through the BPE, whose pre-split makes a code line tokenize the same way in a statement and in a command.

This module stays light; transformers is imported when a chat template is rendered.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from harness_adapters.template_texts import MIN_PIECE_CHARS, sentinel

SUBMIT_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
SUBMIT_SUFFIX = " && " + SUBMIT_COMMAND
_CHAT_SPECIAL = re.compile(r"<\|im_start\|>|<\|im_end\|>")


def render_chat(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                add_generation_prompt: bool = False) -> str:
    """Our chat template rendered the way ``apply_chat_template(..., tokenize=False)`` renders it."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from repro.tinymodel.model import chat_template

    rendered, _ = render_jinja_template([messages], tools=tools, chat_template=chat_template(),
                                        add_generation_prompt=add_generation_prompt)
    return rendered[0]


def tools_block_texts(tools: list[dict[str, Any]], min_chars: int = MIN_PIECE_CHARS) -> list[str]:
    """The fixed text our chat template writes around a system prompt when ``tools`` are offered."""
    system, user = sentinel(0), sentinel(1)
    text = render_chat([{"role": "system", "content": system}, {"role": "user", "content": user}], tools, True)
    pieces = re.split(f"{system}|{user}|{_CHAT_SPECIAL.pattern}", text)
    return sorted({p.strip() for p in pieces if len(p.strip()) >= min_chars})


def tool_call_pieces(name: str = "bash", argument: str = "command") -> tuple[str, str]:
    """(opening, closing) text around a one-argument tool call's string value, as the model emits it and the
    chat template re-renders it: ``<tool_call>\\n{"name": "bash", "arguments": {"command": "`` and
    ``"}}\\n</tool_call>``."""
    value = sentinel(2)
    call = {"type": "function", "function": {"name": name, "arguments": f'{{"{argument}": "{value}"}}'}}
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    turn = render_chat(messages).split("<|im_start|>assistant\n", 1)[1].split("<|im_end|>", 1)[0]
    opening, closing = turn.split(value)
    return opening, closing


def recipe_added_tokens(harness_texts: Sequence[str], tools: list[dict[str, Any]]) -> list[str]:
    """The recipe's added tokens: harness paragraphs, tools block, the wrapper of each tool's first string
    argument, and the submit suffix (sorted and distinct, so token ids are stable across rebuilds)."""
    texts = {*harness_texts, SUBMIT_SUFFIX}
    if tools:
        texts.update(tools_block_texts(tools))
    for tool in tools:
        function = tool.get("function", tool)
        for argument in list(function.get("parameters", {}).get("properties", {}))[:1]:
            texts.update(tool_call_pieces(function["name"], argument))
    return sorted(texts)


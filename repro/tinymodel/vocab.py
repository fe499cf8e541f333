"""The recipe vocabulary: fixed texts that become single added tokens of the tiny model's tokenizer.

What a rollout's prompt and answer repeat verbatim is one token each: every fixed paragraph of the harness's
templates (:func:`fixed_template_texts`, fed by the harness adapter), the fixed part of our chat template's
tools block for the given tools (:func:`tools_block_texts`), the tool-call wrapper around a ``bash`` command
(:func:`tool_call_pieces`) and the submit suffix. Everything else (task statements, code, commands) goes
through the BPE, whose pre-split makes a code line tokenize the same way in a statement and in a command.

This module stays light (jinja2 only); transformers is imported when a chat template is rendered.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import jinja2

SUBMIT_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
SUBMIT_SUFFIX = " && " + SUBMIT_COMMAND
MIN_PIECE_CHARS = 12
_BLANK_LINE = re.compile(r"\n[ \t]*\n")
_SENTINEL = "REPROSENTINEL{}"
_CHAT_SPECIAL = re.compile(r"<\|im_start\|>|<\|im_end\|>")


def template_literals(source: str) -> list[str]:
    """The literal text segments of a Jinja template, after its whitespace control (``{%-``, ``-%}``).

    Lexed with jinja2's default environment (what ``jinja2.Template(source)`` uses), so each segment is
    printed verbatim whenever the template reaches it.
    """
    return [value for _, kind, value in jinja2.Environment().lex(source) if kind == "data"]


def paragraphs(text: str, min_chars: int = MIN_PIECE_CHARS) -> list[str]:
    """``text`` split at blank lines, each piece stripped; pieces shorter than ``min_chars`` are dropped."""
    pieces = (piece.strip() for piece in _BLANK_LINE.split(text))
    return [piece for piece in pieces if len(piece) >= min_chars]


def fixed_template_texts(sources: Iterable[str], min_chars: int = MIN_PIECE_CHARS) -> list[str]:
    """Sorted, distinct paragraphs of the literal text of the Jinja templates ``sources``."""
    literals = [literal for source in sources for literal in template_literals(source)]
    return sorted({piece for literal in literals for piece in paragraphs(literal, min_chars)})


def sentinel(i: int) -> str:
    """A placeholder value that :func:`rendered_texts` splits at (for variables whose value is not fixed)."""
    return _SENTINEL.format(i)


def rendered_texts(source: str, variables: dict[str, Any], min_chars: int = MIN_PIECE_CHARS) -> list[str]:
    """Sorted, distinct paragraphs of the template rendered with ``variables``, split at each :func:`sentinel`."""
    text = jinja2.Template(source, undefined=jinja2.StrictUndefined).render(**variables)
    parts = re.split(_SENTINEL.format(r"\d+"), text)
    return sorted({piece for part in parts for piece in paragraphs(part, min_chars)})


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


"""The fixed text of a harness's Jinja prompt templates: what every rollout's prompt repeats verbatim.

An adapter hands these paragraphs out (mini-SWE-agent: ``MiniSweAgentConfig.fixed_prompt_texts``) and the tiny
model's recipe tokenizer makes each one token. Light: jinja2 only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import jinja2

MIN_PIECE_CHARS = 12
_BLANK_LINE = re.compile(r"\n[ \t]*\n")
_SENTINEL = "REPROSENTINEL{}"


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

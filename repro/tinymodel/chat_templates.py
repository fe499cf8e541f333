"""Chat templates a Qwen3-tokenizer checkpoint can ship (``TinyModelConfig.chat_template``).

- ``default``: Qwen3's own (``qwen3_chat_template.jinja``). It shows a think block only in assistant turns after the
  last real user query and drops it from earlier ones; with ``enable_thinking=false`` the generation prompt ends in an
  empty ``<think>\\n\\n</think>\\n\\n`` that the next render of the same reply leaves out. So with thinking off, every
  turn's prompt breaks the prefix of the next (the ids the model was conditioned on are not the ids of the history).
- ``keep_think``: Qwen3's template with one change, made as a text transformation of it (:func:`keep_think_template`,
  which fails when Qwen3's snippet is not found): every assistant turn keeps its think block as sampled (a reply whose
  text holds ``</think>`` is rendered verbatim), and with thinking off a reply without one gets the empty block the
  generation prompt gave it. Then the prompt of turn k+1 starts with the ids of turn k's prompt + sampled completion
  (what Agent Lightning's SWE example relies on: its own template writes that empty block into every assistant turn).
"""

from __future__ import annotations

CHAT_TEMPLATES = ("default", "keep_think")

# Qwen3's choice of how an assistant turn shows its reasoning (qwen3_chat_template.jinja).
QWEN3_THINK_RULE = """\
        {%- if loop.index0 > state.last_query and (loop.last or reasoning) -%}
            {{- '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') -}}
        {%- else -%}
            {{- content -}}
        {%- endif -%}
"""

# keep_think's: the think block as sampled in every turn; Qwen3's rule only where a reply has none and thinking is on.
KEEP_THINK_RULE = """\
        {#- keep_think (repro.tinymodel.chat_templates): every assistant turn keeps its think block as sampled -#}
        {%- set sampled = text_of(message.content) -%}
        {%- if '</think>' in sampled -%}
            {{- sampled -}}
        {%- elif message.reasoning_content is string -%}
            {{- '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') -}}
        {%- elif enable_thinking is defined and enable_thinking is false -%}
            {{- '<think>\\n\\n</think>\\n\\n' + content -}}
        {%- elif loop.index0 > state.last_query and loop.last -%}
            {{- '<think>\\n\\n</think>\\n\\n' + content.lstrip('\\n') -}}
        {%- else -%}
            {{- content -}}
        {%- endif -%}
"""


def keep_think_template(qwen3: str) -> str:
    """Qwen3's template text ``qwen3`` with :data:`QWEN3_THINK_RULE` replaced by :data:`KEEP_THINK_RULE`;
    ValueError when the rule is not in it exactly once (the template changed: update both snippets)."""
    found = qwen3.count(QWEN3_THINK_RULE)
    if found != 1:
        raise ValueError(f"keep_think: Qwen3's think-block rule occurs {found} times in the chat template, expected "
                         "once; the template changed: update QWEN3_THINK_RULE and KEEP_THINK_RULE in "
                         "repro/tinymodel/chat_templates.py")
    return qwen3.replace(QWEN3_THINK_RULE, KEEP_THINK_RULE)


def check_chat_template(name: str, tokenizer: str) -> None:
    """ValueError unless ``name`` is a known template that the tokenizer ``tokenizer`` can ship."""
    if name not in CHAT_TEMPLATES:
        raise ValueError(f"model.chat_template must be one of {CHAT_TEMPLATES}, got {name!r}")
    if name != "default" and tokenizer != "qwen3":
        raise ValueError(f"model.chat_template={name} rewrites Qwen3's chat template, so it needs "
                         f"model.tokenizer=qwen3 (got tokenizer={tokenizer!r}): set model=tiny_qwen3 or "
                         "model.chat_template=default")


def qwen3_chat_template(name: str) -> str:
    """The chat template ``name`` (:data:`CHAT_TEMPLATES`) on Qwen3's."""
    from repro.tinymodel.qwen3_tokenizer import chat_template

    check_chat_template(name, "qwen3")
    return chat_template() if name == "default" else keep_think_template(chat_template())

"""Token ids of a chat, grown message by message and never re-encoded: the state of a token-in/token-out loop.

A rebuilt loop keeps what the model sampled as ids (no detokenize -> retokenize round trip) and appends each new
message as the ids of the text the chat template adds for it. The real harness instead sends messages, which the
server renders and tokenizes from scratch on every call; :meth:`TokenConversation.rendered_ids` is that view of
the same messages, so the two can be compared token for token (the rebuilt loop's own prefix drift).
"""

from __future__ import annotations

from typing import Any

PROBE_TEXT = "x"  # the one user message new messages are rendered after when the template re-renders history


class TokenConversation:
    """The ids of ``messages`` as a token-in/token-out loop builds them; see the module docstring."""

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]] | None, messages: list[dict[str, Any]]) -> None:
        self.tokenizer, self.tools = tokenizer, tools or None
        self.messages: list[dict[str, Any]] = list(messages)
        self.rerendered_turns = 0
        self.ids: list[int] = self._encode(self._render(self.messages, generation_prompt=False))
        self._generation_ids = self._encode(self._generation_prompt())
        self._after_eos = self._text_after_eos()

    def prompt_ids(self) -> list[int]:
        """What the loop sends next: the conversation plus the assistant header."""
        return [*self.ids, *self._generation_ids]

    def add_completion(self, completion_ids: list[int], message: dict[str, Any]) -> None:
        """Append a sampled turn as sampled (``message`` is its parsed form, kept for the rendered view)."""
        eos = self.tokenizer.eos_token_id
        closing = self._after_eos if completion_ids and completion_ids[-1] == eos else \
            self.tokenizer.decode([eos]) + self._after_eos  # cut off by max_tokens: close the turn as rendered
        self.ids = [*self.prompt_ids(), *completion_ids, *self._encode(closing)]
        self.messages.append(message)

    def add_messages(self, messages: list[dict[str, Any]]) -> None:
        """Append non-sampled messages (observations, format errors) as the text the template adds for them.

        Where the template re-renders earlier messages once these follow (Qwen3 drops the last reply's empty
        ``<think>`` block), the ids already held stay as they were and the new messages' text is the template's
        rendering of them after a one-message probe chat (what trainer-side agent loops append);
        ``rerendered_turns`` counts those appends."""
        before = self._render(self.messages, generation_prompt=False)
        after = self._render([*self.messages, *messages], generation_prompt=False)
        if after.startswith(before):
            added = after[len(before):]
        else:
            self.rerendered_turns += 1
            probe = [{"role": "user", "content": PROBE_TEXT}]
            base = self._render(probe, generation_prompt=False)
            rendered = self._render([*probe, *messages], generation_prompt=False)
            if not rendered.startswith(base):
                raise ValueError("the chat template renders these messages differently after a probe chat; "
                                 "a token-in/token-out loop cannot extend its ids")
            added = rendered[len(base):]
        self.ids = [*self.ids, *self._encode(added)]
        self.messages.extend(messages)

    def rendered_ids(self) -> list[int]:
        """The prompt the server would build from ``messages`` (render + tokenize from scratch)."""
        return list(self.tokenizer.apply_chat_template(self.messages, tools=self.tools, add_generation_prompt=True,
                                                       tokenize=True, return_dict=False))

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=self.tools, tokenize=False,
                                                  add_generation_prompt=generation_prompt)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def _generation_prompt(self) -> str:
        probe = [{"role": "user", "content": "x"}]
        with_prompt, without = self._render(probe, True), self._render(probe, False)
        return with_prompt[len(without):]

    def _text_after_eos(self) -> str:
        """What the template writes after an assistant turn's end token (``\\n`` for ChatML)."""
        eos_text = self.tokenizer.decode([self.tokenizer.eos_token_id])
        probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
        rendered = self._render(probe, False)
        return rendered[rendered.rindex(eos_text) + len(eos_text):]

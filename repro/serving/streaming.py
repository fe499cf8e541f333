"""Response objects for the CPU server: whole responses and SSE chunk streams (vLLM's shapes).

A streamed choice sends a chunk whenever it has visible text or a tool-call delta, and a last chunk with
its ``finish_reason``. Token ids (``return_token_ids``) and logprobs of tokens that released no text
yet ride on the next chunk of their choice, so the concatenated per-chunk ``token_ids`` equal the
non-streaming ``token_ids``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from repro.serving.engine import Event, FinishEvent, TokenEvent
from repro.serving.openai_api import (
    ChoiceOutput,
    CommonParams,
    TokenText,
    build_chat_choice,
    chat_logprob_entries,
    completion_logprobs,
    new_id,
    now,
    usage,
)
from repro.serving.tool_parser import StreamingToolParser

SendJson = Callable[[Any], Awaitable[None]]


def build_chat_response(
    outs: list[ChoiceOutput],
    common: CommonParams,
    model: str,
    prompt_ids: list[int],
    parse_tools: bool,
    token_text: TokenText,
) -> dict[str, Any]:
    """A ``chat.completion`` object."""
    choices = [
        build_chat_choice(
            i,
            out,
            parse_tools=parse_tools,
            logprobs=common.logprobs,
            return_token_ids=common.return_token_ids,
            token_text=token_text,
        )
        for i, out in enumerate(outs)
    ]
    response: dict[str, Any] = {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": now(),
        "model": model,
        "choices": choices,
        "usage": usage(len(prompt_ids), sum(len(o.token_ids) for o in outs)),
    }
    if common.return_token_ids:
        response["prompt_token_ids"] = prompt_ids
    return response


def build_completion_response(
    outs: list[ChoiceOutput], common: CommonParams, model: str, prompts: list[list[int]], token_text: TokenText
) -> dict[str, Any]:
    """A ``text_completion`` object; choice ``i`` belongs to prompt ``i // n``."""
    choices = []
    for i, out in enumerate(outs):
        choice: dict[str, Any] = {
            "index": i,
            "text": out.text,
            "logprobs": completion_logprobs(out.token_ids, out.logprobs, out.top_logprobs, token_text)
            if common.logprobs
            else None,
            "finish_reason": out.finish_reason,
            "stop_reason": out.stop_reason,
        }
        if common.return_token_ids:
            choice["token_ids"] = out.token_ids
            choice["prompt_token_ids"] = prompts[i // common.n]
        choices.append(choice)
    return {
        "id": new_id("cmpl"),
        "object": "text_completion",
        "created": now(),
        "model": model,
        "choices": choices,
        "usage": usage(sum(len(p) for p in prompts), sum(len(o.token_ids) for o in outs)),
    }


@dataclass
class _Pending:
    """Tokens of one choice not yet sent in a chunk."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)

    def add(self, event: TokenEvent) -> None:
        self.ids.append(event.token_id)
        self.logprobs.append(event.logprob)
        self.tops.append(event.top_logprobs or [])

    def take(self) -> _Pending:
        taken = _Pending(self.ids, self.logprobs, self.tops)
        self.ids, self.logprobs, self.tops = [], [], []
        return taken


class ChatStreamer:
    """Turns engine events of one chat request into ``chat.completion.chunk`` objects."""

    def __init__(
        self, common: CommonParams, model: str, prompt_ids: list[int], parse_tools: bool, token_text: TokenText
    ) -> None:
        self.common, self.model, self.prompt_ids, self.token_text = common, model, prompt_ids, token_text
        self.id, self.created = new_id("chatcmpl"), now()
        self.parsers = [StreamingToolParser() if parse_tools else None for _ in range(common.n)]
        self.pending = [_Pending() for _ in range(common.n)]
        self.n_tokens = 0

    async def run(self, events: AsyncIterator[tuple[int, Event]]) -> AsyncIterator[dict[str, Any]]:
        """Yield the chunks: role chunks, content / tool-call deltas, finish chunks, usage."""
        for i in range(self.common.n):
            yield self._chunk(i, {"role": "assistant", "content": ""}, first=i == 0)
        async for tag, event in events:
            if isinstance(event, TokenEvent):
                self.pending[tag].add(event)
                self.n_tokens += 1
                delta = self._delta(tag, event.text, final=False)
                if delta:
                    yield self._chunk(tag, delta)
            elif isinstance(event, FinishEvent) and event.reason != "abort":
                delta = self._delta(tag, event.text, final=True)
                parser = self.parsers[tag]
                reason = "tool_calls" if parser is not None and parser.n_tool_calls else event.reason
                yield self._chunk(tag, delta, reason, event.stop_reason)
        if self.common.include_usage:
            yield {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": usage(len(self.prompt_ids), self.n_tokens),
            }

    def _delta(self, tag: int, text: str, final: bool) -> dict[str, Any]:
        parser = self.parsers[tag]
        if parser is None:
            return {"content": text} if text else {}
        released = parser.feed(text)
        if final:
            rest = parser.finish()
            released.content += rest.content
            released.tool_calls += rest.tool_calls
        delta: dict[str, Any] = {}
        if released.content:
            delta["content"] = released.content
        if released.tool_calls:
            delta["tool_calls"] = released.tool_calls
        return delta

    def _chunk(
        self,
        tag: int,
        delta: dict[str, Any],
        finish_reason: str | None = None,
        stop_reason: str | int | None = None,
        first: bool = False,
    ) -> dict[str, Any]:
        taken = self.pending[tag].take()
        choice: dict[str, Any] = {"index": tag, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason
        if self.common.logprobs and taken.ids:
            choice["logprobs"] = {
                "content": chat_logprob_entries(taken.ids, taken.logprobs, taken.tops, self.token_text)
            }
        if self.common.return_token_ids:
            choice["token_ids"] = taken.ids
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }
        if first and self.common.return_token_ids:
            chunk["prompt_token_ids"] = self.prompt_ids
        return chunk


class CompletionStreamer:
    """Turns engine events of one legacy completions request into ``text_completion`` chunks."""

    def __init__(self, common: CommonParams, model: str, prompts: list[list[int]], token_text: TokenText) -> None:
        self.common, self.model, self.prompts, self.token_text = common, model, prompts, token_text
        self.id, self.created = new_id("cmpl"), now()
        n_choices = len(prompts) * common.n
        self.pending = [_Pending() for _ in range(n_choices)]
        self.offsets = [0] * n_choices
        self.started = [False] * n_choices
        self.n_tokens = 0

    async def run(self, events: AsyncIterator[tuple[int, Event]]) -> AsyncIterator[dict[str, Any]]:
        """Yield a chunk per released text piece and a finish chunk per choice, then usage."""
        async for tag, event in events:
            if isinstance(event, TokenEvent):
                self.pending[tag].add(event)
                self.n_tokens += 1
                if event.text:
                    yield self._chunk(tag, event.text)
            elif isinstance(event, FinishEvent) and event.reason != "abort":
                yield self._chunk(tag, event.text, event.reason, event.stop_reason)
        if self.common.include_usage:
            prompt_tokens = sum(len(p) for p in self.prompts)
            yield {
                "id": self.id,
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": usage(prompt_tokens, self.n_tokens),
            }

    def _chunk(
        self, tag: int, text: str, finish_reason: str | None = None, stop_reason: str | int | None = None
    ) -> dict[str, Any]:
        taken = self.pending[tag].take()
        choice: dict[str, Any] = {"index": tag, "text": text, "logprobs": None, "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason
        if self.common.logprobs:
            choice["logprobs"] = completion_logprobs(
                taken.ids, taken.logprobs, taken.tops, self.token_text, self.offsets[tag]
            )
            self.offsets[tag] += sum(len(t) for t in choice["logprobs"]["tokens"])
        if self.common.return_token_ids:
            choice["token_ids"] = taken.ids
            if not self.started[tag]:
                choice["prompt_token_ids"] = self.prompts[tag // self.common.n]
        self.started[tag] = True
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }

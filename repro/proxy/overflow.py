"""A prompt longer than the served model's context, answered as each client API reports it.

The model servers (vLLM, the CPU server) refuse such a request with HTTP 400 and OpenAI's wording ("This model's
maximum context length is N tokens. However, your request has M input tokens ..."), but with ``code: 400``: a
harness that handles an over-long prompt (compaction, a retry with less, giving up) looks for its own API's error,
so the proxy rewrites the refusal into it (:class:`ContextExceeded`), and records the call with the status
``context_exceeded``, apart from upstream faults:

* chat completions: HTTP 400, ``code: context_length_exceeded``, ``param: messages`` (OpenAI's body);
* Responses: HTTP 400, ``code: context_length_exceeded``, ``param: input``; a streamed request gets a
  ``response.failed`` event with that code instead (:mod:`repro.proxy.openai_responses_stream`), the only form
  Codex maps to "context window exceeded" (its own test fixture, ``codex-rs/core/tests/common/responses.rs``);
* Anthropic Messages: HTTP 400, ``invalid_request_error``, "prompt is too long: M tokens > N maximum".
"""

from __future__ import annotations

import re

import orjson

from repro.common.asgi import HttpError

CODE = "context_length_exceeded"
RESPONSES_MESSAGE = "Your input exceeds the context window of this model. Please adjust your input and try again."
_LIMIT = re.compile(r"maximum context length is (\d+)")
_PROMPT = re.compile(r"(\d+) input tokens|resulted in (\d+) tokens|\((\d+) in the messages")
_COMPLETION = re.compile(r"(\d+) in the completion")


class ContextExceeded(HttpError):
    """The upstream refused the request as longer than the model's context (``limit`` tokens): the prompt alone
    (``prompt_tokens`` when the upstream counted them), or the prompt with the ``max_tokens`` it asked for
    (``completion_tokens``)."""

    def __init__(self, limit: int, prompt_tokens: int | None, completion_tokens: int | None, message: str) -> None:
        super().__init__(400, message, kind="invalid_request_error")
        self.limit = limit
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens

    def body(self) -> bytes:
        """OpenAI chat completions' error body (the servers' message is already OpenAI's wording)."""
        return orjson.dumps({"error": {"message": self.message, "type": self.kind, "param": "messages",
                                       "code": CODE}})

    def responses_body(self) -> bytes:
        """OpenAI Responses' error body."""
        return orjson.dumps({"error": {"message": RESPONSES_MESSAGE, "type": self.kind, "param": "input",
                                       "code": CODE}})

    def anthropic_message(self) -> str:
        """Anthropic's wording, with the counts a client such as Claude Code reads to size what to drop or to
        lower ``max_tokens``."""
        if self.completion_tokens and self.prompt_tokens:
            return (f"input length and `max_tokens` exceed context limit: {self.prompt_tokens} + "
                    f"{self.completion_tokens} > {self.limit}, decrease input length or `max_tokens` and try again")
        counted = f"{self.prompt_tokens} tokens" if self.prompt_tokens else "more tokens"
        return f"prompt is too long: {counted} > {self.limit} maximum"


def context_exceeded(status: int, data: bytes) -> ContextExceeded | None:
    """The refusal in an upstream's error answer (``status``, body ``data``), or None when it is another error."""
    if status not in (400, 413):
        return None
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    fields = error if isinstance(error, dict) else parsed if isinstance(parsed, dict) else {}
    message = str(fields.get("message") or "")
    limit = _LIMIT.search(message)
    if limit is None:
        return None
    prompt, completion = _PROMPT.search(message), _COMPLETION.search(message)
    return ContextExceeded(int(limit.group(1)), int(next(g for g in prompt.groups() if g)) if prompt else None,
                           int(completion.group(1)) if completion else None, message)

"""Deterministic fakes for unit tests and benchmarks only; nothing on the main path imports this package.

``upstream``: the fake vLLM upstream (``python -m repro.testing --port N`` serves it); ``server_thread``: an ASGI
app on a thread; ``harness``: fake harness, sandbox and workspace; ``chat_stub``: an OpenAI-compatible chat stub
for harness tests; ``tokens``: a fake training row and a byte-level tokenizer in miniature.
"""

from repro.testing.chat_stub import StubChatServer, StubReply, chat_completion, text_reply, tool_call_reply
from repro.testing.fake_harness import FakeHarness, FakeSandbox, FakeStreamingHarness, FakeWorkspace
from repro.testing.fake_upstream import (
    UPSTREAM_FAULTS,
    FakeVllmUpstream,
    fake_completion_text,
    fake_prompt_ids,
    faulty_json,
    faulty_stream,
    main,
)
from repro.testing.server_thread import ServerThread
from repro.testing.tokens import FakeByteTokenizer, FakeTrainingRow

__all__ = [
    "UPSTREAM_FAULTS",
    "FakeByteTokenizer",
    "FakeHarness",
    "FakeSandbox",
    "FakeStreamingHarness",
    "FakeTrainingRow",
    "FakeVllmUpstream",
    "FakeWorkspace",
    "ServerThread",
    "StubChatServer",
    "StubReply",
    "chat_completion",
    "fake_completion_text",
    "fake_prompt_ids",
    "faulty_json",
    "faulty_stream",
    "main",
    "text_reply",
    "tool_call_reply",
]

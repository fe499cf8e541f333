"""Hermes tool-call parser: non-streaming, streaming, and their agreement (property test)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from repro.serving.tool_parser import StreamingToolParser, new_tool_call_id, parse_tool_calls


def counter_ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def stream(text_pieces: list[str]) -> tuple[str, list[dict]]:
    """Feed pieces to a streaming parser; return (content, merged tool calls without the index)."""
    parser = StreamingToolParser(make_id=counter_ids())
    deltas = [parser.feed(piece) for piece in text_pieces] + [parser.finish()]
    content = "".join(d.content for d in deltas)
    calls = [call for d in deltas for call in d.tool_calls]
    assert [c["index"] for c in calls] == list(range(len(calls)))
    assert parser.n_tool_calls == len(calls)
    return content, [{k: v for k, v in c.items() if k != "index"} for c in calls]


def block(name: str, arguments: object) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def test_plain_text_is_content() -> None:
    assert parse_tool_calls("hello <tool world") == ("hello <tool world", [])
    assert parse_tool_calls("") == ("", [])


def test_single_call_with_prefix() -> None:
    text = "Let me look.\n" + block("bash", {"command": "ls -la"})
    content, calls = parse_tool_calls(text, make_id=counter_ids())
    assert content == "Let me look.\n"
    assert calls == [
        {"id": "call_0", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls -la"}'}}
    ]


def test_whitespace_prefix_gives_none_content_and_text_after_blocks_is_dropped() -> None:
    text = "\n " + block("a", {}) + " between " + block("b", {"x": [1, "é"]}) + " after"
    content, calls = parse_tool_calls(text)
    assert content is None
    assert [c["function"]["name"] for c in calls] == ["a", "b"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"x": [1, "é"]}
    assert "é" in calls[1]["function"]["arguments"]  # ensure_ascii=False, like vLLM
    assert all(c["id"].startswith("call_") for c in calls)
    assert calls[0]["id"] != calls[1]["id"]


def test_invalid_json_leaves_whole_text_as_content() -> None:
    for bad in (
        "<tool_call>{not json}</tool_call>",
        "<tool_call>[1, 2]</tool_call>",
        '<tool_call>{"x": 1}</tool_call>',
    ):
        text = "pre " + block("ok", {}) + bad
        assert parse_tool_calls(text) == (text, [])


def test_unclosed_final_block_is_parsed_when_valid() -> None:
    content, calls = parse_tool_calls('x<tool_call>{"name": "f", "arguments": {"a": 1}}')
    assert content == "x"
    assert calls[0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    text = 'x<tool_call>{"name": "f", "argu'
    assert parse_tool_calls(text) == (text, [])


def test_missing_arguments_become_empty_object() -> None:
    _, calls = parse_tool_calls('<tool_call>{"name": "f"}</tool_call>')
    assert calls[0]["function"]["arguments"] == "{}"


def test_new_ids_are_unique_hex() -> None:
    ids = {new_tool_call_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(len(i) == 5 + 24 and int(i[5:], 16) >= 0 for i in ids)


def test_streaming_holds_back_partial_tags() -> None:
    parser = StreamingToolParser(make_id=counter_ids())
    assert parser.feed("Hi <tool").content == "Hi "
    assert parser.feed("_ca").content == ""
    delta = parser.feed('ll>{"name": "f", "arguments": {}}</tool_')
    assert delta.content == "" and delta.tool_calls == []
    delta = parser.feed("call> trailing")
    assert delta.tool_calls == [
        {"index": 0, "id": "call_0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    ]
    assert delta.content == ""
    assert parser.finish().content == ""


def test_streaming_releases_false_alarm_and_holds_leading_whitespace() -> None:
    parser = StreamingToolParser()
    assert parser.feed("\n\n").content == ""
    assert parser.feed("<tool").content == ""
    assert parser.feed("box> done").content == "\n\n<toolbox> done"
    assert parser.finish().content == ""
    assert stream(["  ", " "]) == ("   ", [])


def test_streaming_invalid_block_becomes_content() -> None:
    text = "a<tool_call>{oops}</tool_call>b"
    assert stream(list(text)) == (text, [])


_plain = st.lists(st.sampled_from([*'ab <>/_lotc{}\n"', "<tool_call>", "<tool", "</tool_call>", "</tool_call"])).map(
    "".join
)
_args = st.dictionaries(st.text(max_size=4), st.one_of(st.integers(), st.text(max_size=6)), max_size=3)
_valid_block = st.builds(block, st.text(alphabet="abc_", min_size=1, max_size=6), _args)


@st.composite
def texts_with_valid_calls(draw: st.DrawFn) -> str:
    """Text whose every ``<tool_call>`` starts a valid block (prefix + blocks + filler + optional tail)."""
    prefix = draw(_plain.filter(lambda s: "<tool_call>" not in s))
    blocks = draw(st.lists(_valid_block, max_size=3))
    fillers = draw(
        st.lists(_plain.filter(lambda s: "<tool_call>" not in s), min_size=len(blocks), max_size=len(blocks))
    )
    return prefix + "".join(b + f for b, f in zip(blocks, fillers, strict=True))


def split_points(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@settings(max_examples=300, deadline=None)
@given(texts_with_valid_calls(), st.lists(st.integers(min_value=0), max_size=12))
def test_streaming_agrees_with_non_streaming(text: str, cuts: list[int]) -> None:
    content, calls = parse_tool_calls(text, make_id=counter_ids())
    streamed_content, streamed_calls = stream(split_points(text, cuts))
    assert streamed_calls == calls
    if calls:
        assert (streamed_content or None) == content
    else:
        assert streamed_content == content


@settings(max_examples=200, deadline=None)
@given(_plain, st.lists(st.integers(min_value=0), max_size=12))
def test_streaming_without_valid_calls_passes_text_through(text: str, cuts: list[int]) -> None:
    """Tags and tag fragments that never form a valid call come out as content, unchanged and complete."""
    assert parse_tool_calls(text) == (text, [])
    assert stream(split_points(text, cuts)) == (text, [])

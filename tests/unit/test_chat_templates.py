"""``model.chat_template=keep_think``: Qwen3's template with every past assistant turn keeping its think block, so a
multi-turn chat's prompt of turn k+1 starts with the ids of turn k's prompt + sampled completion (thinking on or off);
Qwen3's own template breaks that prefix every turn with thinking off. The default build and cache keys are unchanged,
and the option needs the Qwen3 tokenizer. Skipped only when the ``qwen3-tokenizer`` extra is missing (not in CI)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

try:
    import quicktok  # noqa: F401
except ImportError:
    if os.environ.get("REPRO_REQUIRE_QWEN3_TOKENIZER") == "1":  # CI: these tests must run, not skip
        raise
    pytest.skip("quicktok-v1 missing: pip install -e '.[qwen3-tokenizer]'", allow_module_level=True)

from repro.tinymodel import qwen3_tokenizer as q3
from repro.tinymodel.chat_templates import QWEN3_THINK_RULE, keep_think_template, qwen3_chat_template
from repro.tinymodel.model import MANIFEST_NAME, TinyModelConfig, build_tiny_model, config_dict, inputs_sha256
from repro.tinymodel.recipe import model_key

SMALL_QWEN3 = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                              tokenizer="qwen3")
TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
# Reply texts that start with a letter, so the sampled ids meet the prompt at a pre-token boundary (a reply that
# starts with whitespace is a retokenization break of its own, whatever the template).
WORDS = st.text(st.sampled_from("abcxyz ABC.,:`\n-=()'\""), max_size=30)
REPLY = st.tuples(st.sampled_from(["THOUGHT", "Let", "ok"]), WORDS).map("".join)


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Qwen3's tokenizer (built into a private cache dir); tests set its ``chat_template``."""
    from transformers import PreTrainedTokenizerFast

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REPRO_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield PreTrainedTokenizerFast.from_pretrained(q3.qwen3_tokenizer_dir())


def render(tokenizer: Any, messages: list[dict[str, Any]], thinking: bool) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=True,
                                              return_dict=False, enable_thinking=thinking))


def prefix_breaks(tokenizer: Any, template: str, replies: list[tuple[str, str]], thinking: bool,
                  feedback: str = "user") -> int:
    """Turns of a chat with ``replies`` ((reasoning, text) as sampled; reasoning shown only with thinking on) whose
    next prompt does not start with the turn's prompt + completion ids; each reply is followed by a ``feedback``
    message (``user``: an observation as a user message, as mini-SWE-agent's text mode; ``tool``: a tool result)."""
    tokenizer.chat_template = template
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You fix bugs."},
                                      {"role": "user", "content": "Fix add() in calc.py."}]
    breaks = 0
    for k, (reasoning, text) in enumerate(replies):
        prompt = render(tokenizer, messages, thinking)
        sampled = f"<think>\n{reasoning}\n</think>\n\n{text}" if thinking else text
        completion = [*tokenizer.encode(sampled, add_special_tokens=False), tokenizer.eos_token_id]
        messages += [{"role": "assistant", "content": sampled}, {"role": feedback, "content": f"output {k}"}]
        following = render(tokenizer, messages, thinking)
        breaks += following[:len(prompt) + len(completion)] != [*prompt, *completion]
    return breaks


THREE_TURNS = [("look first", "THOUGHT: read it\n```bash\ncat calc.py\n```"),
               ("the sign", "THOUGHT: fix it\n```bash\nsed -i 's/-/+/' calc.py\n```"),
               ("", "Done.\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```")]


@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("feedback", ["user", "tool"])
def test_keep_think_keeps_every_prompt_a_token_prefix_of_the_next(hf: Any, thinking: bool, feedback: str) -> None:
    assert prefix_breaks(hf, qwen3_chat_template("keep_think"), THREE_TURNS, thinking, feedback) == 0


@pytest.mark.parametrize("feedback", ["user", "tool"])
def test_qwen3s_template_breaks_the_prefix_every_turn_with_thinking_off(hf: Any, feedback: str) -> None:
    assert prefix_breaks(hf, qwen3_chat_template("default"), THREE_TURNS, False, feedback) == len(THREE_TURNS)


def test_qwen3s_template_drops_past_reasoning_behind_a_user_message(hf: Any) -> None:
    """With thinking on, Qwen3 drops the think block of a reply once a real user query follows it."""
    assert prefix_breaks(hf, qwen3_chat_template("default"), THREE_TURNS, True, "user") == len(THREE_TURNS)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(replies=st.lists(st.tuples(WORDS, REPLY), min_size=1, max_size=3), thinking=st.booleans(),
       feedback=st.sampled_from(["user", "tool"]))
def test_keep_think_is_prefix_consistent_for_any_replies(hf: Any, replies: list[tuple[str, str]], thinking: bool,
                                                         feedback: str) -> None:
    assert prefix_breaks(hf, qwen3_chat_template("keep_think"), replies, thinking, feedback) == 0


def test_keep_think_tool_call_turn_extends_the_sampled_ids(hf: Any) -> None:
    """A reply the server parsed into a tool call (no content) follows the empty think block of its prompt."""
    hf.chat_template = qwen3_chat_template("keep_think")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix it."}]
    prompt = render(hf, messages, False)
    sampled = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    completion = [*hf.encode(sampled, add_special_tokens=False), hf.eos_token_id]
    call = {"type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    messages += [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "content": "a.py"}]
    assert render(hf, messages, False)[:len(prompt) + len(completion)] == [*prompt, *completion]


def test_keep_think_renders_a_final_reply_as_qwen3_does(hf: Any) -> None:
    """Outside the changed rule the template is Qwen3's: a chat ending in a reply renders the same with both."""
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    rendered = {}
    for name in ("default", "keep_think"):
        hf.chat_template = qwen3_chat_template(name)
        rendered[name] = hf.apply_chat_template(chat, tokenize=False)
    assert rendered["default"] == rendered["keep_think"] == \
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello.<|im_end|>\n"


def test_keep_think_renders_reasoning_content_in_past_turns_as_qwen3_does_in_recent_ones(hf: Any) -> None:
    """A reply given as ``reasoning_content`` + content keeps Qwen3's rendering of it, behind a user message too."""
    reply = {"role": "assistant", "content": "Hello.", "reasoning_content": "\nGreet back.\n"}
    chat = [{"role": "user", "content": "Hi"}, reply, {"role": "user", "content": "Again"}]
    hf.chat_template = qwen3_chat_template("keep_think")
    assert "<|im_start|>assistant\n<think>\nGreet back.\n</think>\n\nHello.<|im_end|>\n<|im_start|>user\nAgain" in \
        hf.apply_chat_template(chat, tokenize=False)
    hf.chat_template = qwen3_chat_template("default")
    assert "<|im_start|>assistant\nHello.<|im_end|>" in hf.apply_chat_template(chat, tokenize=False)


def test_the_transformation_fails_loudly_when_qwen3s_rule_is_missing() -> None:
    template = q3.chat_template()
    assert keep_think_template(template) != template
    with pytest.raises(ValueError, match=r"occurs 0 times.*update QWEN3_THINK_RULE"):
        keep_think_template(template.replace(QWEN3_THINK_RULE, QWEN3_THINK_RULE.replace("loop.last", "True")))


def test_keep_think_needs_the_qwen3_tokenizer() -> None:
    with pytest.raises(ValueError, match=r"needs model\.tokenizer=qwen3.*set model=tiny_qwen3"):
        TinyModelConfig(chat_template="keep_think")
    with pytest.raises(ValueError, match=r"must be one of \('default', 'keep_think'\), got 'keep'"):
        TinyModelConfig(tokenizer="qwen3", chat_template="keep")


def test_default_cache_keys_are_unchanged() -> None:
    """The keys of checkpoints built before the option existed (values from the code before it)."""
    assert "chat_template" not in config_dict(TinyModelConfig())
    assert inputs_sha256(TinyModelConfig(), ["x"]) == \
        "0010f31cfc1096e93727d53ffd16a893622e5e536e39f190cc9db3672327b66a"
    assert model_key(TinyModelConfig(), ["x"]) == "259def4ecf77e966"
    assert sorted(config_dict(SMALL_QWEN3)) == sorted(config_dict(TinyModelConfig()) | {"tokenizer": "qwen3"})
    keep = TinyModelConfig(**{**SMALL_QWEN3.__dict__, "chat_template": "keep_think"})
    assert config_dict(keep)["chat_template"] == "keep_think"
    assert model_key(keep, []) != model_key(SMALL_QWEN3, [])


def test_keep_think_build_differs_from_the_default_in_its_chat_template_only(hf: Any, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    default = build_tiny_model(tmp_path / "default", SMALL_QWEN3, [])
    keep_config = TinyModelConfig(**{**SMALL_QWEN3.__dict__, "chat_template": "keep_think"})
    keep = build_tiny_model(tmp_path / "keep", keep_config, [])
    assert AutoTokenizer.from_pretrained(default).chat_template == q3.chat_template()  # Qwen3's, byte for byte
    assert AutoTokenizer.from_pretrained(keep).chat_template == qwen3_chat_template("keep_think")
    names = {p.name for p in default.iterdir()}
    assert names == {p.name for p in keep.iterdir()}
    differ = {name for name in names if (default / name).read_bytes() != (keep / name).read_bytes()}
    assert MANIFEST_NAME in differ and differ - {MANIFEST_NAME} <= {"chat_template.jinja", "tokenizer_config.json"}
    assert (default / "model.safetensors").read_bytes() == (keep / "model.safetensors").read_bytes()
    manifests = [json.loads((d / MANIFEST_NAME).read_text()) for d in (default, keep)]
    assert "chat_template" not in manifests[0]["config"] and manifests[1]["config"]["chat_template"] == "keep_think"
    assert manifests[0]["inputs_sha256"] != manifests[1]["inputs_sha256"]

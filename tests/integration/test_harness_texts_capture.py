"""OpenCode's fixed texts captured from its real requests (the expert server, the proxy, two rollouts in fresh
working copies): none holds a rollout's own path, and the recipe tokenizer made from them cuts OpenCode's first
prompt, ~16k tokens of a plain 4k BPE, to a small fraction (what the tiny model then prefills)."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from harness_adapters.opencode import OpenCodeConfig
from repro.recipe.harness_texts import capture_requests, fixed_texts, message_text
from repro.tinymodel.model import TinyModelConfig, build_tiny_model
from repro.tinymodel.vocab import recipe_added_tokens


def _prompt_tokens(model_dir: Path, request: dict) -> int:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    messages = [{"role": m["role"], "content": message_text(m)} for m in request["messages"]]
    ids = tokenizer.apply_chat_template(messages, tools=request.get("tools"), add_generation_prompt=True,
                                        tokenize=True)
    return len(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_captured_opencode_texts_shrink_its_prompt(tmp_path: Path) -> None:
    requests = capture_requests("opencode", OpenCodeConfig(isolation="none"))
    assert len(requests) == 2
    captured = fixed_texts(requests)
    assert len(captured.tools()) == 10 and captured.tools() == requests[0]["tools"]
    assert any(t.startswith("You are opencode") for t in captured.fixed_prompt_texts())
    assert not any("repro-workspaces-" in t for t in captured.fixed_prompt_texts())
    tokens = recipe_added_tokens(captured.fixed_prompt_texts(), captured.tools())
    plain = build_tiny_model(tmp_path / "plain", TinyModelConfig(vocab_size=1024), [])
    recipe = build_tiny_model(tmp_path / "recipe", TinyModelConfig(vocab_size=1024, extra_added_tokens=tokens), [])
    before, after = _prompt_tokens(plain, requests[1]), _prompt_tokens(recipe, requests[1])
    assert before > 10_000 and after * 5 < before, (before, after)

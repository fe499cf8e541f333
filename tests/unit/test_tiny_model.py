"""Tiny offline model: determinism, loadability, tokenizer and chat template."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoTokenizer

from repro.tinymodel.model import MANIFEST_NAME, TinyModelConfig, build_tiny_model

SMALL = TinyModelConfig(vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def _files(path: Path) -> dict[str, bytes]:
    return {name: (path / name).read_bytes() for name in ("model.safetensors", "tokenizer.json", "config.json")}


def test_same_seed_and_corpus_give_identical_files(tmp_path: Path) -> None:
    corpus = ["alpha beta gamma " * 20, "def f(x):\n    return x * 2\n"]
    config = TinyModelConfig(**{**SMALL.__dict__, "extra_added_tokens": ["zz top", "a paragraph\n"]})
    first = _files(build_tiny_model(tmp_path / "a", config, corpus))
    second = _files(build_tiny_model(tmp_path / "b", config, corpus))
    assert first == second
    other_seed = _files(build_tiny_model(tmp_path / "c", TinyModelConfig(**{**config.__dict__, "seed": 1}), corpus))
    assert other_seed["model.safetensors"] != first["model.safetensors"]
    assert other_seed["tokenizer.json"] == first["tokenizer.json"]
    manifest = json.loads((tmp_path / "a" / MANIFEST_NAME).read_text())
    manifest_c = json.loads((tmp_path / "c" / MANIFEST_NAME).read_text())
    assert manifest["inputs_sha256"] != manifest_c["inputs_sha256"]
    assert manifest["config"]["extra_added_tokens"] == ["zz top", "a paragraph\n"]


def test_build_is_identical_across_processes(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Hash-map seeds differ between processes: a fresh interpreter must build the same files."""
    code = (
        "import sys; from pathlib import Path; from repro.tinymodel.model import TinyModelConfig, build_tiny_model;"
        "build_tiny_model(Path(sys.argv[1]), TinyModelConfig(vocab_size=int(sys.argv[2])), [])"
    )
    vocab = json.loads((tiny_model_dir / MANIFEST_NAME).read_text())["config"]["vocab_size"]
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "fresh"), str(vocab)], check=True, capture_output=True)
    assert _files(tmp_path / "fresh") == _files(tiny_model_dir)


def test_checkpoint_loads_with_special_tokens(tiny_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = AutoConfig.from_pretrained(tiny_model_dir)
    assert config.model_type == "qwen3" and config.tie_word_embeddings
    assert config.vocab_size == len(tok)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    manifest = json.loads((tiny_model_dir / MANIFEST_NAME).read_text())
    assert manifest["eos_token_id"] == tok.eos_token_id
    gen = json.loads((tiny_model_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tok.eos_token_id
    for special in ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"):
        assert len(tok.encode(special, add_special_tokens=False)) == 1, special
    text = 'x <tool_call>\n{"a": 1}\n</tool_call> é'
    assert tok.decode(tok.encode(text, add_special_tokens=False), skip_special_tokens=False) == text
    # tool tags are not "special": they survive skip_special_tokens, as in Qwen's tokenizer
    assert "<tool_call>" in tok.decode(tok.encode(text, add_special_tokens=False), skip_special_tokens=True)


def test_extra_added_tokens_are_single_and_sorted(tmp_path: Path) -> None:
    config = TinyModelConfig(**{**SMALL.__dict__, "extra_added_tokens": ["zeta word", "alpha line\n", "zeta word"]})
    tok = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "m", config, []))
    alpha, zeta = tok.convert_tokens_to_ids(["alpha line\n", "zeta word"])
    assert alpha + 1 == zeta
    assert tok.encode("say alpha line\nzeta word", add_special_tokens=False)[-2:] == [alpha, zeta]


def render(tok, messages, tools=None, add_generation_prompt=True) -> str:
    return tok.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False)


def test_chat_template_plain_messages(tiny_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render(tok, messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render(tok, messages, add_generation_prompt=False).endswith("Hi<|im_end|>\n")


def test_chat_template_tools_calls_and_responses(tiny_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    as_string = {"function": {"name": "bash", "arguments": '{"command": "ls"}'}, "id": "1", "type": "function"}
    as_dict = {"function": {"name": "bash", "arguments": {"command": "ls"}}, "id": "1", "type": "function"}
    base = [
        {"role": "system", "content": [{"type": "text", "text": "Sys "}, {"type": "text", "text": "prompt"}]},
        {"role": "user", "content": "Do it"},
    ]
    tail = [
        {"role": "tool", "tool_call_id": "1", "content": [{"type": "text", "text": "a.py"}]},
        {"role": "tool", "tool_call_id": "2", "content": "b.py"},
    ]
    with_string = render(tok, [*base, {"role": "assistant", "content": None, "tool_calls": [as_string]}, *tail], TOOLS)
    with_dict = render(tok, [*base, {"role": "assistant", "content": "", "tool_calls": [as_dict]}, *tail], TOOLS)
    assert with_string == with_dict
    assert with_string.startswith("<|im_start|>system\nSys prompt\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in with_string
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>\n'
    ) in with_string
    assert (
        "<|im_start|>user\n<tool_response>\na.py\n</tool_response>\n<tool_response>\nb.py\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ) in with_string
    ids = tok.apply_chat_template(base, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert tok.decode(ids, skip_special_tokens=False) == render(tok, base, TOOLS)


@pytest.mark.parametrize("content", ["Thinking.", [{"type": "text", "text": "Thinking."}]])
def test_chat_template_assistant_text_then_call(tiny_model_dir: Path, content: object) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    call = {"type": "function", "function": {"name": "f", "arguments": {}}}
    text = render(
        tok,
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": content, "tool_calls": [call, call]}],
        TOOLS,
        False,
    )
    assert text.endswith(
        '<|im_start|>assistant\nThinking.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>\n'
    )

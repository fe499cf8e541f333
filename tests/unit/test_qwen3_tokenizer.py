"""Qwen3's tokenizer rebuilt from quicktok-v1: identical ids to the package's encoder, every id round-trips, and the
chat template writes Qwen3's format. Skipped only when the ``qwen3-tokenizer`` extra (in ``dev``) is missing, and
never under ``REPRO_REQUIRE_QWEN3_TOKENIZER=1`` (CI)."""

from __future__ import annotations

import json
import os
import unicodedata
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

from repro.evaluation.retokenization import is_utf8
from repro.tinymodel import qwen3_tokenizer as q3

CODE = [
    'def résumé(naïve: str, n: int = 1_000_000) -> dict[str, float]:\n    """Σ over ünïcödé — 42 ≠ 4.2e1."""\n'
    "\tif n >= 0x7F and naïve != 'café':\n\t\treturn {\"π\": 3.14159265, 'λ': -0.5e-3}\n"
    "                                                            # long run of spaces\n\n\n\n"
    "    x = [i ** 2 for i in range(123456789)]  # 中文注释 🚀\r\n    return {}\n",
    "#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 2147483647);\n\t\t\t\treturn 0;\n}\n",
    "$ ls -la /tmp && grep -rn 'TODO' src/ | head -20\n   \t  \n12:34:56.789 ERROR [pid 31337] don't, can't, we'll\n",
    "SELECT id, name FROM users WHERE age > 18 AND city = 'São Paulo' ORDER BY 1 DESC LIMIT 10;",
]
PROSE = [
    "The quick brown fox jumps over the lazy dog. It's 2026; they've paid $1,234.56 (≈€1.1k).",
    "Zürich, Kraków, Ærøskøbing — façade, coöperate. Ça va? ¿Qué tal? ½ ¼ ² ³ ™ ©",
    "日本語のテキストと中文文本，还有한국어 문장도 있습니다。",
    "Русский текст с цифрами 123 и ёлками. Ελληνικά κείμενα. עברית וערבית: مرحبا بالعالم",
    "हिन्दी में वाक्य। ภาษาไทย ไม่มีช่องว่าง. Tiếng Việt có dấu.",
    "Emoji: 👋🏽 👩‍💻 🇩🇪 ❤️ 🚀🔥 and ZWJ families 👨‍👩‍👧‍👦; decomposed e\u0301 vs é; Å\u212b\u00c5",
    "\u00a0non-breaking\u2009thin\u3000ideographic  spaces\u200b and\u00adsoft hyphen",
]
TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command in the repository",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Fix the failing test in tests/test_calc.py — «add» returns a - b."},
    {"role": "assistant", "content": "Let me look.", "tool_calls": [{"type": "function", "function": {
        "name": "bash", "arguments": json.dumps({"command": "cat calc.py && pytest -q\t# ünï"})}}]},
    {"role": "tool",
     "content": "def add(a, b):\n    return a - b\n\nFAILED tests/test_calc.py::test_add - assert -1 == 3"},
    {"role": "tool", "content": "1 failed in 0.02s"},
    {"role": "assistant", "content": "<think>\nThe sign is wrong.\n</think>\n\nFixing it.", "tool_calls": [
        {"type": "function",
         "function": {"name": "bash", "arguments": {"command": "sed -i 's/a - b/a + b/' calc.py"}}}]},
    {"role": "tool", "content": "<|im_end|> is text here"},
]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The tokenizer folder, built into a private cache dir."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REPRO_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield q3.qwen3_tokenizer_dir()


@pytest.fixture(scope="module")
def hf(built: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(built)


@pytest.fixture(scope="module")
def enc() -> Any:
    return q3.quicktok_encoding()


def reference_ids(enc: Any, text: str) -> list[int]:
    return list(enc.encode(text, allowed_special="all"))


def test_built_folder_is_a_cached_offline_hf_tokenizer(built: Path, hf: Any) -> None:
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in built.iterdir()}
    assert built.parent.name == "tokenizers" and built.name == f"qwen3-{q3.cache_key()}"
    mtime = (built / "tokenizer.json").stat().st_mtime_ns
    assert q3.qwen3_tokenizer_dir() == built and (built / "tokenizer.json").stat().st_mtime_ns == mtime
    assert len(hf) == q3.N_IDS
    specials = (hf.eos_token, hf.eos_token_id, hf.pad_token, hf.pad_token_id)
    assert specials == ("<|im_end|>", 151645, "<|endoftext|>", 151643)
    spec = json.loads((built / "tokenizer.json").read_text())
    assert spec["normalizer"]["type"] == "NFC"
    assert len(spec["model"]["merges"]) == 151_643 - 256


def test_special_tokens_have_the_package_ids(hf: Any, enc: Any) -> None:
    for token in enc.special_tokens_set:
        assert hf.convert_tokens_to_ids(token) == enc.encode_single_token(token.encode()), token
    assert hf.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<tool_call>", "</think>"]) == [
        151643, 151644, 151657, 151668]
    kept = hf.decode([151657, 151667, 151644, 151645], skip_special_tokens=True)
    assert kept == "<tool_call><think>"  # tool-call and think tags are plain added tokens, as in Qwen3


@pytest.mark.parametrize("text", CODE + PROSE, ids=[f"code{i}" for i in range(len(CODE))] +
                         [f"prose{i}" for i in range(len(PROSE))])
def test_ids_equal_the_package_encoder(hf: Any, enc: Any, text: str) -> None:
    ids = hf.encode(text, add_special_tokens=False)
    assert ids == reference_ids(enc, text)
    assert hf.decode(ids) == unicodedata.normalize("NFC", text)


def test_chat_rendered_conversations_with_tool_calls_encode_identically(hf: Any, enc: Any) -> None:
    for messages, tools in ((CONVERSATION, TOOLS), (CONVERSATION[1:], None), (CONVERSATION[:3], TOOLS)):
        text = hf.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        ids = hf.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=True,
                                     return_dict=False)
        assert ids == reference_ids(enc, text)
        assert text.count("<tool_call>") == hf.convert_ids_to_tokens(ids).count("<tool_call>") >= 2
        assert ids.count(151644) == text.count("<|im_start|>")


def test_chat_template_writes_qwen3_format(hf: Any) -> None:
    text = hf.apply_chat_template(CONVERSATION[:6], tools=TOOLS, tokenize=False, add_generation_prompt=True)
    tool_json = json.dumps(TOOLS[0], ensure_ascii=False)
    first_args = json.dumps({"command": "cat calc.py && pytest -q\t# ünï"})
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tool_json}\n</tools>"
        "\n\nFor each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
        "\n</tool_call><|im_end|>\n"
        "<|im_start|>user\nFix the failing test in tests/test_calc.py — «add» returns a - b.<|im_end|>\n"
        f'<|im_start|>assistant\nLet me look.\n<tool_call>\n{{"name": "bash", "arguments": {first_args}}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\ndef add(a, b):\n    return a - b\n\n"
        "FAILED tests/test_calc.py::test_add - assert -1 == 3\n</tool_response>\n"
        "<tool_response>\n1 failed in 0.02s\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\nThe sign is wrong.\n</think>\n\nFixing it.\n<tool_call>\n"
        '{"name": "bash", "arguments": {"command": "sed -i \'s/a - b/a + b/\' calc.py"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>assistant\n"
    )
    no_think = hf.apply_chat_template(CONVERSATION[1:2], tokenize=False, add_generation_prompt=True,
                                      enable_thinking=False)
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # reasoning before the last user query is dropped; the last assistant turn gets a (possibly empty) think block
    history = [*CONVERSATION[1:2], {"role": "assistant", "content": "<think>old</think>A"},
               {"role": "user", "content": "again"}, {"role": "assistant", "content": "B"}]
    rendered = hf.apply_chat_template(history, tokenize=False)
    assert "<|im_start|>assistant\nA<|im_end|>" in rendered
    assert rendered.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nB<|im_end|>\n")


def test_every_id_round_trips(built: Path, enc: Any) -> None:
    """Each id's token spells the package's bytes; BPE on those bytes alone gives the id back; ids whose bytes are
    UTF-8 decode to that text and encode back to the package's ids for it (NFC text decodes unchanged)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(built / "tokenizer.json"))
    table, specials = q3.id_table(enc)
    unspell = {ch: byte for byte, ch in enumerate(q3.byte_alphabet())}
    special_of = {i: token for token, i in specials.items()}
    assert tok.get_vocab_size(with_added_tokens=True) == len(table) + len(specials) == q3.N_IDS
    for i in range(q3.N_IDS):
        token = tok.id_to_token(i)
        if i in special_of:
            assert token == special_of[i]
            continue
        assert bytes(unspell[ch] for ch in token) == table[i], i
        assert [t.id for t in tok.model.tokenize(token)] == [i], i
    texts = {i: b.decode("utf-8") for i, b in enumerate(table) if is_utf8(b)}
    texts.update(special_of)
    ids = list(texts)
    decoded = tok.decode_batch([[i] for i in ids], skip_special_tokens=False)
    assert decoded == [texts[i] for i in ids]
    encoded = [e.ids for e in tok.encode_batch([texts[i] for i in ids], add_special_tokens=False)]
    for i, got in zip(ids, encoded, strict=True):
        assert got == reference_ids(enc, texts[i]), i
        assert b"".join(enc.decode_single_token_bytes(t) for t in got) == unicodedata.normalize(
            "NFC", texts[i]).encode(), i
    assert sum(got == [i] for i, got in zip(ids, encoded, strict=True)) > 0.9 * len(ids)


_PIECES = st.sampled_from([" ", "  ", "\n", "\r\n", "\t", "'s", "'LL", "0", "42", "x", "Word", "é", "e\u0301", "Å",
                           "\u212b", "ﬁ", "日本", "한국어", "🚀", "👍🏽", "\u200d", "\u00a0", "—", "«", "()", "{}",
                           ":=", "<|im_end|>", "<tool_call>", "Ⅻ", "٣"])


# Assigned code points only (Python's Unicode 14 tables): the two regex engines classify code points assigned
# later differently (see the test below), which no real text of Qwen3's training era contains.
_ASSIGNED = st.characters(exclude_categories=("Cs", "Cn"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.text(_ASSIGNED, max_size=120),
                      st.lists(_PIECES | st.text(_ASSIGNED, max_size=3), max_size=40).map("".join)))
def test_random_unicode_encodes_identically(hf: Any, enc: Any, text: str) -> None:
    assert hf.encode(text, add_special_tokens=False) == reference_ids(enc, text)


def test_code_points_newer_than_the_regex_tables_are_the_known_difference(hf: Any, enc: Any) -> None:
    """U+16FF2 is unassigned in Unicode 14 and a letter in Unicode 16: `tokenizers` (the engine of Hugging Face's
    own Qwen3 tokenizer, and of this one) treats it as a non-letter, quicktok as a letter, so the ``/`` after it
    joins a different pre-token. Found by the property test above; kept here so a change of either engine shows."""
    text = "\U00016ff2/A"
    assert hf.encode(text, add_special_tokens=False) != reference_ids(enc, text)
    assert hf.encode("\u4e00/A", add_special_tokens=False) == reference_ids(enc, "\u4e00/A")  # assigned: same


def test_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "quicktok", None)
    with pytest.raises(q3.MissingExtraError, match=r"\.\[qwen3-tokenizer\]") as info:
        q3.quicktok_encoding()
    assert "\n" not in str(info.value)


def test_build_model_command_prints_the_cached_folder_or_names_the_extra(
        built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from repro.cli.commands import main

    main(["build-model", "--tokenizer", "qwen3"])
    assert capsys.readouterr().out.strip() == str(built)
    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(__import__("sys").modules, "quicktok", None)
    with pytest.raises(SystemExit) as info:
        main(["build-model", "--tokenizer", "qwen3"])
    assert str(info.value).startswith("repro build-model: ") and "'.[qwen3-tokenizer]'" in str(info.value)
    assert "\n" not in str(info.value) and not (tmp_path / "tokenizers").exists()
    with pytest.raises(SystemExit, match="--out is required"):
        main(["build-model"])


def test_merge_derivation_takes_the_last_rank_bpe_step() -> None:
    table = [b"a", b"b", b"c", b"ab", b"bc", b"abc"]  # "abc": "ab" (id 3) joins first, then "ab" + "c"
    assert q3.derive_merges(table) == [(b"a", b"b"), (b"b", b"c"), (b"ab", b"c")]
    with pytest.raises(ValueError, match="does not build"):
        q3.derive_merges([b"a", b"b", b"c", b"abc"])


def test_cpu_server_serves_a_tiny_model_on_the_qwen3_tokenizer(built: Path, tmp_path: Path) -> None:
    """The CPU server's app (in-process, no port) answers a tool-calling chat on the Qwen3 vocabulary with the prompt
    ids of Qwen3's template, the sampled ids and their logprobs."""
    import asyncio

    import httpx

    from repro.serving.cpu_server import ServerConfig, create_app
    from repro.serving.engine import EngineConfig
    from repro.tinymodel.model import TinyModelConfig, build_tiny_model

    config = TinyModelConfig(tokenizer="qwen3", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                             intermediate_size=64, max_position_embeddings=1024)
    model_dir = build_tiny_model(tmp_path / "tiny-qwen3", config, [])
    manifest = json.loads((model_dir / "repro_model.json").read_text())
    assert manifest["vocab_size"] == q3.N_IDS and manifest["config"]["tokenizer"] == "qwen3"
    assert (model_dir / "tokenizer.json").read_bytes() == (built / "tokenizer.json").read_bytes()
    app = create_app(ServerConfig(EngineConfig(model_dir=model_dir, max_model_len=1024)))
    body = {"model": model_dir.name, "messages": CONVERSATION[:4], "tools": TOOLS, "max_tokens": 8, "seed": 3,
            "temperature": 1.0, "logprobs": True, "top_logprobs": 2, "return_token_ids": True}

    async def ask() -> dict[str, Any]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
            response = await client.post("/v1/chat/completions", json=body)
            response.raise_for_status()
            return response.json()

    try:
        out = asyncio.run(ask())
    finally:
        app.engine.close()
    tokenizer = app.engine.tokenizer
    prompt = tokenizer.apply_chat_template(CONVERSATION[:4], tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert out["prompt_token_ids"] == reference_ids(q3.quicktok_encoding(), prompt)
    (choice,) = out["choices"]
    ids, entries = choice["token_ids"], choice["logprobs"]["content"]
    assert 1 <= len(ids) <= 8 and all(0 <= i < q3.N_IDS for i in ids) and len(entries) == len(ids)
    assert all(entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 2 for entry in entries)


def test_token_conversation_extends_ids_where_qwen3_rerenders_the_last_reply(hf: Any) -> None:
    """Qwen3 renders a final reply with an empty think block and drops it once a tool result follows, so the
    conversation's text is not a prefix of the next render; the rebuilt loop's token-in/token-out state keeps the
    sampled ids and appends the tool result as the template writes it, which here is the server's own render."""
    from repro.rl.rebuilt.conversation import TokenConversation
    from repro.tinymodel.expert import tool_call_text

    conv = TokenConversation(hf, TOOLS, CONVERSATION[:2])
    first = conv.prompt_ids()
    sampled = [*hf.encode(tool_call_text("ls"), add_special_tokens=False), hf.eos_token_id]
    call = {"type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}
    reply = {"role": "assistant", "content": "", "tool_calls": [call]}
    rendered_last = hf.apply_chat_template([*CONVERSATION[:2], reply], tools=TOOLS, tokenize=False)
    assert "<think>\n\n</think>" in rendered_last  # the quirk that breaks the prefix
    conv.add_completion(sampled, reply)
    conv.add_messages([{"role": "tool", "content": "calc.py"}])
    prompt = conv.prompt_ids()
    assert prompt[:len(first) + len(sampled)] == [*first, *sampled] and conv.rerendered_turns == 1
    assert hf.decode(prompt[len(first) + len(sampled):]) == \
        "\n<|im_start|>user\n<tool_response>\ncalc.py\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert prompt == conv.rendered_ids()

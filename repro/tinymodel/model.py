"""A tiny, offline, deterministic Qwen3 checkpoint: byte-level BPE tokenizer + random-init model.

``build_tiny_model(out_dir, TinyModelConfig(seed=0), corpus)`` writes a normal transformers checkpoint
directory (``config.json``, ``model.safetensors``, ``generation_config.json``, tokenizer files with a
Qwen-style tool-calling chat template) plus ``repro_model.json`` (config + sha256 of the inputs).
The same config and corpus give byte-identical weights and ``tokenizer.json``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

import tokenizers
import torch
import transformers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from repro.tinymodel.chat_templates import check_chat_template, qwen3_chat_template

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, EOS_TOKEN)
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
MANIFEST_NAME = "repro_model.json"

# Pieces a BPE merge never crosses: contractions, a word, one digit, one punctuation character (each
# with an optional leading space), whitespace runs (the last space of a run goes with the next word).
_SPLIT_PATTERN = r"'(?:s|t|re|ve|m|ll|d)| ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]|\s+(?!\S)|\s+"

DEFAULT_CORPUS = (
    "The quick brown fox jumps over the lazy dog. A small model can still learn the shape of a task "
    "when the examples are clear. Please read the file, find the bug and fix it. The tests should pass "
    "after the change. Thank you for the report; I will look into it and reply soon.",
    "def add(a, b):\n    return a + b\n\n\nclass Counter:\n    def __init__(self) -> None:\n"
    "        self.count = 0\n\n    def step(self, n: int = 1) -> int:\n        self.count += n\n"
    '        return self.count\n\n\nif __name__ == "__main__":\n    for i in range(10):\n'
    "        print(add(i, 2 * i - 1))\n",
    "import os\nimport sys\n\n\ndef main(argv: list[str]) -> int:\n    path = argv[1] if len(argv) > 1 "
    "else '.'\n    for name in sorted(os.listdir(path)):\n        if name.endswith('.py'):\n"
    "            print(name)\n    return 0\n",
    "ls -la\ncd /tmp/work && cat main.py\ngrep -rn 'def ' src/ | head -20\n"
    "sed -i 's/return a - b/return a + b/' calc.py && python -m pytest -q tests/\n"
    "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\nfind . -name '*.py' | xargs wc -l\n",
    '{"name": "bash", "arguments": {"command": "ls -la"}}\n'
    '{"type": "function", "function": {"name": "bash", "description": "Run a shell command", '
    '"parameters": {"type": "object", "properties": {"command": {"type": "string"}}, '
    '"required": ["command"]}}}\n[1, 2, 3, true, false, null, 0.5, -7]\n',
)


@dataclass
class TinyModelConfig:
    """Everything that determines a tiny checkpoint (with the corpus)."""

    seed: int = 0  # the random weights' seed
    vocab_size: int = 2048  # the BPE's size before added tokens
    hidden_size: int = 128  # Qwen3 shape: head_dim = hidden_size / num_heads
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2  # grouped-query attention: num_heads / num_kv_heads queries share a key/value head
    intermediate_size: int = 384  # the MLP's width
    max_position_embeddings: int = 8192
    extra_added_tokens: list[str] = field(default_factory=list)
    # The recipe tokenizer: the harness's fixed paragraphs, tools block, tool-call wrapper and submit suffix as
    # single tokens. A job resolves it into extra_added_tokens (repro.tinymodel.recipe.resolve_model_config).
    recipe_tokens: bool = False
    # "bpe": the BPE above, trained on the corpus; "qwen3": Qwen3's exact tokenizer and chat template
    # (repro.tinymodel.qwen3_tokenizer; vocab_size, the corpus and extra_added_tokens are then not used).
    tokenizer: str = "bpe"
    # > 0: every layer attends to the last sliding_window tokens only (Qwen3's sliding-window attention), so a model
    # fine-tuned on rows cut to that many tokens behaves the same on longer prompts; 0: full attention.
    sliding_window: int = 0
    # "default": the tokenizer's own chat template; "keep_think" (tokenizer "qwen3" only): Qwen3's with every past
    # assistant turn keeping its think block as sampled, so each prompt is a token prefix of the next
    # (repro.tinymodel.chat_templates).
    chat_template: str = "default"

    def __post_init__(self) -> None:
        check_chat_template(self.chat_template, self.tokenizer)


TOKENIZERS = ("bpe", "qwen3")


def config_dict(config: TinyModelConfig) -> dict:
    """The config as built (``recipe_tokens`` is resolved before a build, so it is left out, and so are the default
    ``tokenizer``, ``sliding_window`` and ``chat_template``: hashes of configs from before they existed stay the
    same)."""
    data = asdict(config)
    data.pop("recipe_tokens")
    if data["tokenizer"] == "bpe":
        data.pop("tokenizer")
    if not data["sliding_window"]:
        data.pop("sliding_window")
    if data["chat_template"] == "default":
        data.pop("chat_template")
    return data


def chat_template() -> str:
    """The Qwen-style tool-calling chat template shipped with the package."""
    return resources.files("repro.tinymodel").joinpath("chat_template.jinja").read_text(encoding="utf-8")


def inputs_sha256(config: TinyModelConfig, corpus: list[str]) -> str:
    """sha256 over the config, the corpus texts, the default corpus and the chat template (for ``tokenizer="qwen3"``
    also the Qwen3 tokenizer's cache key: package version and its template; for another ``chat_template`` also the
    template written)."""
    digest = hashlib.sha256()
    digest.update(json.dumps(config_dict(config), sort_keys=True).encode())
    if config.tokenizer == "qwen3":
        from repro.tinymodel.qwen3_tokenizer import cache_key

        digest.update(cache_key().encode())
    if config.chat_template != "default":
        digest.update(qwen3_chat_template(config.chat_template).encode("utf-8"))
    for text in (*DEFAULT_CORPUS, *corpus, chat_template()):
        digest.update(hashlib.sha256(text.encode("utf-8")).digest())
    return digest.hexdigest()


def train_tokenizer(config: TinyModelConfig, corpus: list[str]) -> Tokenizer:
    """Train the byte-level BPE tokenizer; added tokens get ids after the trained vocabulary."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([*DEFAULT_CORPUS, *corpus], trainer=trainer)
    extra = sorted(set(config.extra_added_tokens) - set(TOOL_TOKENS) - set(SPECIAL_TOKENS))
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in (*TOOL_TOKENS, *extra)])
    return tok


def wrap_tokenizer(tok: Tokenizer, max_length: int) -> PreTrainedTokenizerFast:
    """Wrap a trained tokenizer with the special tokens and chat template transformers needs."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=chat_template(),
        clean_up_tokenization_spaces=False,
        model_max_length=max_length,
    )


def make_tokenizer(config: TinyModelConfig, corpus: list[str]) -> PreTrainedTokenizerFast:
    """The checkpoint's tokenizer: the trained BPE, or Qwen3's (built once into the cache) with the chat template
    ``config.chat_template``."""
    if config.tokenizer not in TOKENIZERS:
        raise ValueError(f"tokenizer must be one of {TOKENIZERS}, got {config.tokenizer!r}")
    check_chat_template(config.chat_template, config.tokenizer)
    if config.tokenizer == "bpe":
        return wrap_tokenizer(train_tokenizer(config, corpus), config.max_position_embeddings)
    from repro.tinymodel.qwen3_tokenizer import qwen3_tokenizer_dir

    tokenizer = PreTrainedTokenizerFast.from_pretrained(qwen3_tokenizer_dir())
    tokenizer.model_max_length = config.max_position_embeddings
    if config.chat_template != "default":
        tokenizer.chat_template = qwen3_chat_template(config.chat_template)
    return tokenizer


def sliding_window_settings(window: int, num_layers: int) -> dict:
    """Qwen3Config's fields for sliding-window attention in every layer (none for ``window`` 0)."""
    if window <= 0:
        return {}
    return {"use_sliding_window": True, "sliding_window": window, "max_window_layers": 0,
            "layer_types": ["sliding_attention"] * num_layers}


def build_model(config: TinyModelConfig, vocab_size: int, eos_id: int, pad_id: int) -> Qwen3ForCausalLM:
    """Random-init Qwen3 model, seeded by ``config.seed``."""
    model_config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.hidden_size // config.num_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
        **sliding_window_settings(config.sliding_window, config.num_layers),
    )
    torch.manual_seed(config.seed)
    model = Qwen3ForCausalLM(model_config)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id)
    return model.eval()


def build_tiny_model(out_dir: Path, config: TinyModelConfig, corpus: list[str]) -> Path:
    """Build the tokenizer and model, save both to ``out_dir``, return ``out_dir``."""
    if config.recipe_tokens:
        raise ValueError("recipe_tokens is set but not resolved: build with repro.tinymodel.recipe."
                         "resolve_model_config(config, harness_cfg), which fills extra_added_tokens")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer(config, corpus)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    model = build_model(config, len(tokenizer), eos_id, pad_id)
    tokenizer.save_pretrained(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    manifest = {
        "config": config_dict(config),
        "inputs_sha256": inputs_sha256(config, corpus),
        "n_corpus_texts": len(corpus),
        "vocab_size": len(tokenizer),
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
    }
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return out_dir

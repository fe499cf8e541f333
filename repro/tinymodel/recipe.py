"""The recipe model: the tiny Qwen3 with the recipe tokenizer, built for a harness and a set of train tasks.

Recipe tokenizer = a BPE (``TinyModelConfig.vocab_size``, 4096 in ``repro/conf/model/tiny_recipe.yaml``) trained
on the train tasks' statements and code (:func:`recipe_corpus`), plus single added tokens for every fixed text
of a rollout (:func:`repro.tinymodel.vocab.recipe_added_tokens`: the harness's template paragraphs, the tools
block, the tool-call wrapper, the submit suffix). ``TinyModelConfig.recipe_tokens`` asks for the latter;
:func:`resolve_model_config` turns it into ``extra_added_tokens`` for the harness in use.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from repro.common.files import cache_dir, locked
from repro.tasks.blobs import buggy_files
from repro.tinymodel.model import TinyModelConfig, build_tiny_model, config_dict
from repro.tinymodel.vocab import recipe_added_tokens

_PATCHED = re.compile(r"^\+\+\+ b/(.+)$", re.MULTILINE)
_CHAT_ROLES = "system\nuser\nassistant\ntool\n"  # the role names after <|im_start|> (else spelled by letters)
# Words of any Linux/macOS ``platform.uname()``, which mini-SWE-agent puts in every first prompt: without them the
# line costs ~50 tokens spelled letter by letter. Machine-independent (no kernel release or host name).
_PLATFORM_WORDS = "Linux Darwin Kernel Version SMP PREEMPT_DYNAMIC PREEMPT_RT x86_64 aarch64 arm64 GNU\n"


@runtime_checkable
class RecipeHarness(Protocol):
    """A harness config that hands out what its prompts repeat verbatim (mini-SWE-agent's ``MiniSweAgentConfig``):
    asked for, never imported, so the harness adapters need nothing from this package."""

    def fixed_prompt_texts(self, platform_line: bool = False) -> list[str]:
        """The fixed paragraphs of its prompt templates (``platform_line``: with the rendered platform line)."""
        ...

    def tools(self) -> list[dict[str, Any]]:
        """The ``tools`` list the harness sends."""
        ...


def resolve_model_config(config: TinyModelConfig, harness: Any, platform_line: bool = False) -> TinyModelConfig:
    """``config`` with its recipe tokens for the mini-SWE-agent config ``harness`` added to ``extra_added_tokens``
    (``recipe_tokens`` then off); unchanged when ``config.recipe_tokens`` is off. ``platform_line``: see
    :meth:`RecipeHarness.fixed_prompt_texts` (off: the tokenizer is the same on every machine)."""
    if not config.recipe_tokens:
        return config
    if not isinstance(harness, RecipeHarness):
        raise ValueError("recipe tokens are defined for mini-SWE-agent only (a harness config with "
                         f"fixed_prompt_texts and tools), got {type(harness).__name__}")
    tokens = recipe_added_tokens(harness.fixed_prompt_texts(platform_line=platform_line), harness.tools())
    return replace(config, recipe_tokens=False, extra_added_tokens=sorted({*config.extra_added_tokens, *tokens}))


def recipe_corpus(tasks: list[Any]) -> list[str]:
    """The recipe's BPE corpus: the chat role names, platform words, each task's statement and the files its gold
    patch changes at the task's base commit (``tasks`` are :class:`repro.tasks.schema.Task`: pass the train split's)."""
    files = buggy_files((t, path) for t in tasks for path in _PATCHED.findall(t.patch))
    statements = (t.problem_statement for t in tasks)
    texts = [_CHAT_ROLES, _PLATFORM_WORDS, *statements, *(text for text in files.values() if text)]
    return list(dict.fromkeys(texts))


def build_recipe_model(model: TinyModelConfig, harness: Any, tasks: list[Any], platform_line: bool = False) -> Path:
    """The (cached) checkpoint of ``model`` with the BPE trained on :func:`recipe_corpus` of ``tasks`` and, when
    ``model.recipe_tokens``, the recipe tokens of ``harness`` (a harness with a ``cfg``, or its config)."""
    config = resolve_model_config(model, getattr(harness, "cfg", harness), platform_line)
    path, _ = tiny_model(config, recipe_corpus(tasks))
    return path


def model_key(config: TinyModelConfig, corpus: list[str]) -> str:
    """The cache key of a resolved ``config`` and ``corpus``: a hash of the built config, the corpus and, for the Qwen3
    tokenizer, its cache key (and the rewritten chat template, for another ``chat_template`` than the default)."""
    parts: list[Any] = [config_dict(config), corpus]
    if config.tokenizer == "qwen3":  # a new quicktok-v1 or Qwen3 template gives a new checkpoint
        from repro.tinymodel.qwen3_tokenizer import cache_key

        parts.append(cache_key())
    if config.chat_template != "default":  # a change to the rewritten template gives a new checkpoint
        from repro.tinymodel.chat_templates import qwen3_chat_template

        parts.append(hashlib.sha256(qwen3_chat_template(config.chat_template).encode()).hexdigest())
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def tiny_model(config: TinyModelConfig, corpus: list[str], harness: Any = None) -> tuple[Path, bool]:
    """The tiny checkpoint for (config, corpus), built once and cached by a hash of both; (dir, was_cached).

    ``harness`` (its config) is needed when ``config.recipe_tokens`` is set, see
    :func:`resolve_model_config`."""
    config = resolve_model_config(config, harness)
    out = cache_dir() / "models" / f"tiny-{model_key(config, corpus)}"
    if (out / "repro_model.json").exists():
        return out, True
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    build_tiny_model(tmp, config, corpus)
    with locked(out.parent / f"{out.name}.lock"):  # another process may have built it meanwhile: keep the first
        if not (out / "repro_model.json").exists():
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
    shutil.rmtree(tmp, ignore_errors=True)
    return out, False

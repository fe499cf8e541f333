"""Weight reload for the CPU server (``POST /v1/load_weights``): what the RL trainer calls after an update.

The new checkpoint must have the served tokenizer (same ``tokenizer.json`` bytes) and the same architecture
(its ``config.json`` minus bookkeeping keys); it is read off the event loop, then swapped in on the engine
thread between two batches, so no batch ever mixes weights. The served model name does not change.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from repro.serving.openai_api import BadRequestError

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

    from repro.serving.engine import Engine

# config.json keys that do not change what the weights compute at inference
IGNORED_CONFIG_KEYS = frozenset({
    "transformers_version", "dtype", "torch_dtype", "use_cache", "output_attentions", "output_hidden_states",
    "return_dict", "attention_dropout", "initializer_range", "id2label", "label2id", "problem_type",
})


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def architecture(config: PretrainedConfig) -> dict[str, Any]:
    """The config keys a reload must keep (everything but bookkeeping and ``_private`` keys)."""
    return {k: v for k, v in config.to_dict().items() if k not in IGNORED_CONFIG_KEYS and not k.startswith("_")}


def parse_body(body: bytes) -> Path:
    """The ``model_dir`` of a ``{"model_dir": "<dir>"}`` body; BadRequestError when malformed or absent."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequestError(f"malformed JSON body: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("model_dir"), str) or not data["model_dir"]:
        raise BadRequestError('the body must be a JSON object {"model_dir": "<checkpoint directory>"}')
    model_dir = Path(data["model_dir"]).expanduser()
    for name in ("config.json", "tokenizer.json"):
        if not (model_dir / name).is_file():
            raise BadRequestError(f"{model_dir} has no {name}: pass a transformers checkpoint directory")
    return model_dir


def check_compatible(engine: Engine, model_dir: Path) -> None:
    """BadRequestError unless ``model_dir`` has the served tokenizer and architecture."""
    from transformers import AutoConfig

    if file_sha256(model_dir / "tokenizer.json") != engine.tokenizer_sha256:
        raise BadRequestError(f"{model_dir}/tokenizer.json differs from the served tokenizer's; a reload must keep "
                              f"the tokenizer (start a new server for another one)")
    try:
        new = architecture(AutoConfig.from_pretrained(model_dir))
    except Exception as exc:
        raise BadRequestError(f"cannot read {model_dir}/config.json: {type(exc).__name__}: {exc}") from exc
    served = architecture(engine.model.config)
    changed = sorted(k for k in new.keys() | served.keys() if new.get(k) != served.get(k))
    if changed:
        detail = ", ".join(f"{k}: {served.get(k)!r} -> {new.get(k)!r}" for k in changed[:8])
        raise BadRequestError(f"{model_dir} has another architecture than the served model ({detail})")


def load_checkpoint(model_dir: Path) -> PreTrainedModel:
    """The checkpoint's model in float32; BadRequestError when weights are missing or of the wrong shape."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        model, info = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, output_loading_info=True)
    except Exception as exc:
        raise BadRequestError(f"cannot load the weights of {model_dir}: {type(exc).__name__}: {exc}") from exc
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "mismatched_keys") and v}
    if bad:
        raise BadRequestError(f"{model_dir} does not hold every weight of the model: {bad}")
    return model.eval()


async def reload_weights(engine: Engine, body: bytes) -> dict[str, Any]:
    """Check and load the checkpoint named by ``body``, swap it in between batches; ``{model_dir, seconds}``."""
    started = time.monotonic()
    model_dir = parse_body(body)
    await asyncio.to_thread(check_compatible, engine, model_dir)
    model = await asyncio.to_thread(load_checkpoint, model_dir)
    await asyncio.wrap_future(engine.between_batches(lambda: engine.swap_model(model, model_dir)))
    return {"model_dir": str(model_dir), "seconds": round(time.monotonic() - started, 4)}

"""Sliding-window attention in the tiny model (``model=tiny_qwen3``): built into the config, left out of the cache key
when off, and served by the CPU engine exactly as transformers generates with it, on prompts longer than the window
and in one batch of unequal lengths."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from repro.serving.engine import Engine, EngineConfig, SamplingParams, TokenEvent
from repro.tinymodel.model import TinyModelConfig, build_tiny_model, config_dict

WINDOW = 8
SMALL = TinyModelConfig(vocab_size=300, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                        intermediate_size=64, sliding_window=WINDOW)


@pytest.fixture(scope="module")
def windowed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a window of 8 and weights redrawn at a larger scale (random init greedily repeats)."""
    out = build_tiny_model(tmp_path_factory.mktemp("sw") / "m", SMALL, [])
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    model.save_pretrained(out)
    return out


def test_every_layer_slides_and_the_default_keeps_old_cache_keys(windowed: Path) -> None:
    config = AutoConfig.from_pretrained(windowed)
    assert config.sliding_window == WINDOW and config.layer_types == ["sliding_attention"] * 2
    assert "sliding_window" not in config_dict(TinyModelConfig()) and config_dict(SMALL)["sliding_window"] == WINDOW


def _reference(model_dir: Path, prompt: list[int], n: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, attention_mask=None,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_the_prefix_cache_keeps_nothing_of_a_sliding_window_and_the_engine_goes_on(windowed: Path) -> None:
    """The CPU server keeps finished rows' keys and values by default; a sliding-window cache holds only the last
    window's positions, and keeping them as a whole prefix once failed every row still generating in the batch
    when another one finished (long prompts: an agent's)."""
    engine = Engine(EngineConfig(model_dir=windowed, max_batch_size=4, max_model_len=512, prefix_cache_tokens=4096))
    prompts = [[(7 * i + 3) % 250 + 20 for i in range(300)], [(5 * i + 1) % 250 + 20 for i in range(200)]]
    lengths = [3, 9]  # the first row finishes while the second goes on

    async def tokens(prompt: list[int], n: int) -> list[int]:
        params = SamplingParams(temperature=0, max_tokens=n, stop_token_ids=[])
        return [e.token_id async for e in engine.generate(prompt, params) if isinstance(e, TokenEvent)]

    async def both() -> list[list[int]]:
        return list(await asyncio.wait_for(asyncio.gather(*(tokens(p, n) for p, n in zip(prompts, lengths,
                                                                                          strict=True))), 60))

    try:
        served = asyncio.run(both())
    finally:
        engine.close()
    assert served == [_reference(windowed, p, n) for p, n in zip(prompts, lengths, strict=True)]


def test_the_engine_matches_transformers_past_the_window_in_one_batch(windowed: Path) -> None:
    prompts = [[(7 * i + 3) % 250 + 20 for i in range(29)], [(5 * i + 1) % 250 + 20 for i in range(13)]]
    engine = Engine(EngineConfig(model_dir=windowed, max_batch_size=4, max_model_len=128))
    params = SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[])

    async def tokens(prompt: list[int]) -> list[int]:
        return [e.token_id async for e in engine.generate(prompt, params) if isinstance(e, TokenEvent)]

    async def both() -> list[list[int]]:
        return list(await asyncio.gather(*(tokens(p) for p in prompts)))

    try:
        served = asyncio.run(both())
    finally:
        engine.close()
    full = AutoModelForCausalLM.from_pretrained(windowed, dtype=torch.float32).eval()
    full.config.layer_types = ["full_attention"] * 2
    assert served == [_reference(windowed, p, len(s)) for p, s in zip(prompts, served, strict=True)]
    assert all(len(s) > WINDOW for s in served)
    with torch.no_grad():  # the window changes what the model computes on a prompt longer than it
        windowed_logits = AutoModelForCausalLM.from_pretrained(windowed).eval()(torch.tensor([prompts[0]])).logits
        assert not torch.allclose(windowed_logits[0, -1], full(torch.tensor([prompts[0]])).logits[0, -1])

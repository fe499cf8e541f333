"""The CPU engine's prefix cache: what it keeps and finds, and that a call reusing a kept prefix samples what a full
prefill samples (same tokens, logprobs equal up to summation order)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.serving.engine import Engine, EngineConfig, FinishEvent, SamplingParams, TokenEvent
from repro.serving.prefix_cache import PrefixCache, stacked_prefix


def layers_of(n: int, value: float = 0.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((2, n, 4), value), torch.full((2, n, 4), -value))]


def test_lookup_finds_the_longest_proper_prefix() -> None:
    cache = PrefixCache(100)
    cache.store([1, 2], layers_of(2, 1.0))
    cache.store([1, 2, 3, 4], layers_of(4, 2.0))
    cache.store([9, 9, 9], layers_of(3))
    n, layers = cache.lookup([1, 2, 3, 4, 5])
    assert n == 4 and layers is not None and float(layers[0][0][0, 0, 0]) == 2.0
    assert cache.lookup([1, 2, 3, 4])[0] == 2, "the whole prompt is never reused: one token must be left to prefill"
    assert cache.lookup([1, 3])[0] == 0 and cache.lookup([7])[1] is None
    assert (cache.hits, cache.lookups, cache.reused_tokens) == (2, 4, 6)


def test_eviction_keeps_the_budget_and_drops_the_least_recently_used() -> None:
    cache = PrefixCache(10)
    cache.store([1, 2, 3, 4], layers_of(4))
    cache.store([5, 6, 7, 8], layers_of(4))
    assert cache.lookup([1, 2, 3, 4, 0])[0] == 4  # [1..4] is now the most recent
    cache.store([9, 9, 9], layers_of(3))
    assert cache.tokens == 7 and len(cache) == 2
    assert cache.lookup([5, 6, 7, 8, 0])[0] == 0 and cache.lookup([1, 2, 3, 4, 0])[0] == 4
    cache.store(list(range(11)), layers_of(11))  # longer than the whole budget: not kept, nothing evicted
    assert cache.tokens == 7
    cache.clear()
    assert (cache.tokens, len(cache), cache.lookup([1, 2, 3, 4, 0])[0]) == (0, 0, 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), max_size=30), st.integers(1, 20),
       st.lists(st.integers(0, 3), max_size=8))
def test_budget_and_matches_hold_for_any_sequence_of_stores(stored: list[list[int]], budget: int,
                                                           prompt: list[int]) -> None:
    cache = PrefixCache(budget)
    for ids in stored:
        cache.store(ids, layers_of(len(ids)))
        assert cache.tokens <= budget
    assert cache.tokens == sum(len(k) for k in cache._entries)
    n, layers = cache.lookup(prompt)
    if n:
        assert n < len(prompt) and tuple(prompt[:n]) in cache._entries and layers[0][0].shape[1] == n
    else:
        assert not any(len(k) < len(prompt) and tuple(prompt[: len(k)]) == k for k in cache._entries)


def test_stacked_prefix_right_aligns_each_row() -> None:
    rows = [(2, layers_of(2, 1.0)), (0, None), (3, layers_of(3, 2.0))]
    (keys, values), = stacked_prefix(rows, 3, layers_of(1))
    assert keys.shape == (3, 2, 3, 4)
    assert keys[0, 0, :, 0].tolist() == [0.0, 1.0, 1.0] and keys[1].abs().sum() == 0
    assert values[2, 0, :, 0].tolist() == [-2.0, -2.0, -2.0]


@pytest.fixture(scope="module")
def engines(tiny_model_dir: Path) -> Iterator[tuple[Engine, Engine]]:
    plain = Engine(EngineConfig(model_dir=tiny_model_dir, max_batch_size=4))
    cached = Engine(EngineConfig(model_dir=tiny_model_dir, max_batch_size=4, prefix_cache_tokens=4096))
    yield plain, cached
    plain.close()
    cached.close()


def sample(engine: Engine, prompts: list[list[int]], max_tokens: int = 8) -> list[tuple[list[int], list[float]]]:
    """Each prompt's greedy tokens and logprobs, the prompts submitted together (one batch when they fit)."""
    async def run() -> list[tuple[list[int], list[float]]]:
        queues = [asyncio.Queue() for _ in prompts]
        for prompt, out in zip(prompts, queues, strict=True):
            engine.submit(prompt, SamplingParams(temperature=0, max_tokens=max_tokens, stop_token_ids=[]), out)
        results = []
        for out in queues:
            ids, logprobs = [], []
            while not isinstance(event := (await asyncio.wait_for(out.get(), 30))[1], FinishEvent):
                assert isinstance(event, TokenEvent)
                ids.append(event.token_id)
                logprobs.append(event.logprob)
            results.append((ids, logprobs))
        return results

    return asyncio.run(run())


def test_a_call_that_extends_a_finished_row_reuses_it_and_samples_the_same(engines: tuple[Engine, Engine]) -> None:
    plain, cached = engines
    first = [5, 9, 13, 2, 7, 11, 3]
    (ids, _), = sample(cached, [first])
    assert sample(plain, [first])[0][0] == ids
    follow_ups = [first + ids + [4, 6, 8], [1, 2, 3, 4, 5]]  # one extends the finished row, one is new
    reused_before = cached.prefix.reused_tokens
    with_cache, without = sample(cached, follow_ups), sample(plain, follow_ups)
    assert cached.prefix.reused_tokens - reused_before == len(first) + len(ids) - 1
    for (a_ids, a_lp), (b_ids, b_lp) in zip(with_cache, without, strict=True):
        assert a_ids == b_ids
        assert max(abs(x - y) for x, y in zip(a_lp, b_lp, strict=True)) < 1e-4


def test_loading_other_weights_clears_the_cache(engines: tuple[Engine, Engine]) -> None:
    _, cached = engines
    sample(cached, [[3, 1, 4, 1, 5]])
    assert len(cached.prefix) > 0
    cached.between_batches(lambda: cached.swap_model(cached.model, cached.loaded_dir)).result(timeout=30)
    assert len(cached.prefix) == 0

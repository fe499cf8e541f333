"""Prefix caching for the CPU engine: the keys and values of a finished row, reused by the next call that extends it.

An agent harness re-sends its whole conversation on every call: call n+1's prompt is call n's prompt, the tokens it
sampled and the new observation (the trace store's ``extends_previous``). Prefilling that prompt again recomputes
what the engine computed a moment ago. :class:`PrefixCache` keeps each finished row's keys and values (its prompt
and the sampled tokens it fed back, not the last one), bounded by a token budget with least-recently-used eviction;
a new row whose prompt starts with a kept sequence prefills only the rest. A match is exact on token ids, so the
reused entries are what a full prefill would compute, up to the summation order of another batch shape (the
same freedom a batch already has). Entries belong to one set of weights: the engine clears the cache when it
loads others.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence

import torch

LayerKV = tuple[torch.Tensor, torch.Tensor]  # one layer's keys and values of one row: [kv_heads, tokens, head_dim]


class PrefixCache:
    """Kept rows' keys and values by token sequence (at most ``max_tokens`` tokens in all; 0 keeps nothing)."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], list[LayerKV]] = OrderedDict()
        self._lengths: Counter[int] = Counter()
        self.tokens = 0
        self.hits = self.lookups = self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt_ids: Sequence[int]) -> tuple[int, list[LayerKV] | None]:
        """``(n, layers)`` of the longest kept sequence that is a proper prefix of ``prompt_ids`` (at least one
        prompt token is left to prefill, whose logits give the first sampled token); ``(0, None)`` when none."""
        self.lookups += 1
        for n in sorted((n for n in self._lengths if n < len(prompt_ids)), reverse=True):
            key = tuple(prompt_ids[:n])
            layers = self._entries.get(key)
            if layers is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                self.reused_tokens += n
                return n, layers
        return 0, None

    def store(self, ids: Sequence[int], layers: list[LayerKV]) -> None:
        """Keep ``layers`` (each ``[kv_heads, len(ids), head_dim]``) for the sequence ``ids``, evicting the least
        recently used entries past the budget; a sequence longer than the whole budget is not kept."""
        key = tuple(ids)
        if not key or len(key) > self.max_tokens:
            return
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        self._entries[key] = layers
        self._lengths[len(key)] += 1
        self.tokens += len(key)
        while self.tokens > self.max_tokens:
            old, _ = self._entries.popitem(last=False)
            self._forget(len(old))

    def clear(self) -> None:
        """Drop every entry (their keys and values belong to the weights that computed them)."""
        self._entries.clear()
        self._lengths.clear()
        self.tokens = 0

    def _forget(self, n: int) -> None:
        self.tokens -= n
        self._lengths[n] -= 1
        if not self._lengths[n]:
            del self._lengths[n]


def stacked_prefix(entries: Sequence[tuple[int, list[LayerKV] | None]], width: int,
                   like: list[LayerKV]) -> list[LayerKV]:
    """Per layer, the rows' kept keys and values right-aligned in ``width`` columns (zeros where a row has fewer,
    masked out by the caller): ``[rows, kv_heads, width, head_dim]``. ``like``: any entry's layers (their number,
    shapes and dtype)."""
    out = []
    for layer, (k0, v0) in enumerate(like):
        keys = k0.new_zeros((len(entries), k0.shape[0], width, k0.shape[2]))
        values = v0.new_zeros((len(entries), v0.shape[0], width, v0.shape[2]))
        for i, (n, layers) in enumerate(entries):
            if n and layers is not None:
                keys[i, :, width - n:] = layers[layer][0]
                values[i, :, width - n:] = layers[layer][1]
        out.append((keys, values))
    return out

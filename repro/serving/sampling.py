"""Per-row token sampling and incremental detokenization with stop strings (used by the engine)."""

from __future__ import annotations

from typing import Protocol

import torch
from tokenizers import Tokenizer

GREEDY_TEMPERATURE = 1e-5


class RowSampling(Protocol):
    """The sampling fields a row needs (``engine.SamplingParams`` has them)."""

    temperature: float
    top_p: float


def sample_row(logits: torch.Tensor, params: RowSampling, generator: torch.Generator) -> int:
    """Sample one token id from a row of logits: greedy at temperature 0, else temperature + top-p."""
    if params.temperature < GREEDY_TEMPERATURE:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        outside = (torch.cumsum(sorted_probs, dim=0) - sorted_probs) >= params.top_p
        sorted_probs[outside] = 0.0
        return int(order[torch.multinomial(sorted_probs, 1, generator=generator)])
    return int(torch.multinomial(probs, 1, generator=generator))


class TextTracker:
    """Turns sampled token ids into released text, holding back what a stop string could still claim.

    Ids whose bytes end in an incomplete UTF-8 character are decoded together with the next ones, so
    the released pieces concatenate to ``tokenizer.decode(all_ids)`` (cut at a stop string, if any).
    """

    def __init__(self, tokenizer: Tokenizer, stop: list[str]) -> None:
        self._tokenizer = tokenizer
        self._stop = [s for s in stop if s]
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._pending_ids: list[int] = []
        self._held = ""

    def add(self, token_id: int) -> tuple[str, str | None]:
        """Add a token; return (text released now, the stop string that ended the text or None)."""
        self._pending_ids.append(token_id)
        piece = self._tokenizer.decode(self._pending_ids, skip_special_tokens=False)
        if piece.endswith("\ufffd"):
            return "", None
        self._pending_ids.clear()
        self._held += piece
        hit = self._find_stop()
        if hit is not None:
            index, stop = hit
            released, self._held = self._held[:index], ""
            return released, stop
        cut = max(0, len(self._held) - self._hold)
        released, self._held = self._held[:cut], self._held[cut:]
        return released, None

    def flush(self) -> str:
        """Release everything left (at eos or the token limit)."""
        tail = self._tokenizer.decode(self._pending_ids, skip_special_tokens=False) if self._pending_ids else ""
        released, self._held, self._pending_ids = self._held + tail, "", []
        return released

    def _find_stop(self) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self._stop:
            index = self._held.find(stop)
            if index >= 0 and (best is None or index < best[0]):
                best = (index, stop)
        return best

"""An engine whose completions are scripted (e.g. by the miniature's expert) instead of sampled from the model.

It answers through the same app as the model (prompt and completion token ids from the served tokenizer, logprobs
0.0), so the proxy records scripted rollouts like any other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from repro.serving.engine import BatchRow, Engine, EngineConfig, EngineRequest, FinishEvent

log = logging.getLogger(__name__)


class ScriptedEngine(Engine):
    """An :class:`Engine` whose rows are ``script(decoded prompt)`` then eos (the model is loaded, unused)."""

    def __init__(self, config: EngineConfig, script: Callable[[str], str]) -> None:
        self.script = script
        super().__init__(config)
        self._eos_id = self.tokenizer.eos_token_id

    def completion_ids(self, prompt_ids: list[int]) -> list[int]:
        """The scripted completion's token ids for a prompt, ending with eos."""
        prompt = self._decoder.decode(prompt_ids, skip_special_tokens=False)
        return [*self._decoder.encode(self.script(prompt), add_special_tokens=False).ids, self._eos_id]

    def _generate_batch(self, batch: list[EngineRequest]) -> None:
        for req in batch:
            row = BatchRow(req, self._decoder, self.eos_ids)
            for token_id in self.completion_ids(req.prompt_ids):
                if req.cancelled.is_set():
                    req.emit(FinishEvent("abort", None, ""))
                    break
                top = [(token_id, 0.0)] if req.params.top_logprobs > 0 else None
                if row.step(token_id, 0.0, top):
                    break

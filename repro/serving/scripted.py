"""An engine whose completions are scripted instead of sampled from the model: by the miniature's expert (plugged in
by name, :func:`load_script`: serving never imports it) or by scenario replies from a JSON file
(:func:`scenario_script`, for harness-behaviour tests).

It answers through the same app as the model (prompt and completion token ids from the served tokenizer, logprobs
0.0), so the proxy records scripted rollouts like any other.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Callable
from pathlib import Path

from repro.serving.engine import BatchRow, Engine, EngineConfig, EngineRequest, FinishEvent

log = logging.getLogger(__name__)

Script = Callable[[str], str]  # decoded prompt -> completion text


class ScriptedEngine(Engine):
    """An :class:`Engine` whose rows are ``script(decoded prompt)`` then eos (the model is loaded, unused)."""

    def __init__(self, config: EngineConfig, script: Script) -> None:
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


def scenario_script(scenarios_path: Path) -> Script:
    """Scripted replies per scenario: ``scenarios_path`` is a JSON object ``{name: [reply text, ...]}``; a prompt
    belongs to the scenario whose marker ``SCENARIO <name>.`` it contains (put it in the task statement), and turn
    ``i`` (the number of user blocks after the first) gets reply ``i`` (the last one repeats); no marker: ``""``."""
    scenarios = json.loads(Path(scenarios_path).read_text())

    def reply(prompt: str) -> str:
        name = next((k for k in scenarios if f"SCENARIO {k}." in prompt), None)
        if name is None:
            return ""
        replies, turn = scenarios[name], prompt.count("<|im_start|>user") - 1
        return replies[min(turn, len(replies) - 1)]

    return reply


def load_script(ref: str, *args: object) -> Script:
    """The script made by the factory ``ref`` (``"package.module:function"``) called with ``args``: a script source
    outside serving (the expert) plugs in by name, so this package imports none of them."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)(*args)

"""The scripted expert of the miniature: a teacher that knows each task's gold fix (warm-start demonstrations)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from repro.expert.script import ExpertScript

__all__ = ["ExpertScript", "serving_script"]
log = logging.getLogger(__name__)


def serving_script(tasks_jsonl: Path, slip_rate: float = 0.0, slip_seed: int = 0,
                   slip_operators: tuple[str, ...] = ()) -> Callable[[str], str]:
    """The expert's completions (decoded prompt -> text) for the tasks of a JSONL file: what the CPU server's scripted
    engine answers with under ``--expert-tasks`` (it loads this function by name, ``EXPERT_SCRIPT``)."""
    script = ExpertScript.from_jsonl(Path(tasks_jsonl), slip_rate, slip_seed, slip_operators)
    log.info("expert: %d tasks, %d with a one-line fix", len(script.commands), script.n_scripted)
    return script.completion

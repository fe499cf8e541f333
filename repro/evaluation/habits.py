"""Habits of a policy, counted by code from the commands it issued in stored rollouts.

The miniature's planted weakness is the expert's slip: ``sed -n 'ADDRs|OLD|NEW|' FILE`` (prints nothing) typed for
``sed -i`` (edits in place). A warm start that copied it as a habit of a kind of task shows it on held-out tasks of
that kind; RL can only remove what shows. :func:`slip_share` counts, per evaluation, the samples whose rollout
issued such an edit, overall and per mutation operator.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from repro.store import open_store
from repro.store.trace_records import CallRecord

_SLIPPED_EDIT = re.compile(r"^sed -n '\d*s\|")
_TEXT_BLOCK = re.compile(r"```(?:bash|mswea_bash_command)[ \t]*\n(.*?)\n?```", re.DOTALL)  # text-mode harnesses


def call_commands(call: CallRecord) -> list[str]:
    """The commands in a stored call's response: the ``command`` arguments of its tool calls, else (a text-mode
    harness such as mini-SWE-agent 1.x) its ```` ```bash ```` blocks."""
    choices = (call.response or {}).get("choices") or [{}]
    message = choices[0].get("message") or {}
    if not message.get("tool_calls"):
        return [block.strip() for block in _TEXT_BLOCK.findall(message.get("content") or "")]
    commands = []
    for tool_call in message.get("tool_calls") or ():
        try:
            arguments = json.loads((tool_call.get("function") or {}).get("arguments") or "{}")
        except json.JSONDecodeError:
            continue
        if isinstance(arguments, dict) and isinstance(arguments.get("command"), str):
            commands.append(arguments["command"])
    return commands


def is_slipped_edit(command: str) -> bool:
    """Whether ``command`` is the slipped edit: ``sed -n`` with a substitution script."""
    return bool(_SLIPPED_EDIT.match(command.strip()))


def slip_share(store_path: Path, reports: Iterable[Any], operators: dict[str, str]) -> dict[str, Any]:
    """Samples whose rollout issued a slipped edit: ``{"samples", "slipped", "share", "by_operator": {op: [slipped,
    samples]}}``; ``operators`` maps instance id -> mutation operator."""
    store = open_store(store_path)
    by_operator: dict[str, list[int]] = {}
    try:
        for report in reports:
            commands = [c for call in store.calls(report.rollout_id) for c in call_commands(call)]
            hit = any(is_slipped_edit(c) for c in commands)
            counts = by_operator.setdefault(operators.get(report.instance_id, "?"), [0, 0])
            counts[0] += hit
            counts[1] += 1
    finally:
        store.close()
    slipped, samples = sum(c[0] for c in by_operator.values()), sum(c[1] for c in by_operator.values())
    return {"samples": samples, "slipped": slipped, "share": slipped / samples if samples else 0.0,
            "by_operator": dict(sorted(by_operator.items()))}

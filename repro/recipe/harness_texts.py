"""The fixed texts of a harness whose prompts are not templates on disk (OpenCode's, OpenHands', the CLIs' are built
inside the harness): captured from what the harness sends, for the tiny model's recipe tokenizer.

:func:`capture_requests` runs the harness, unchanged, on bundled ``locate`` tasks in fresh working copies through
the real proxy and a CPU server that answers as the scripted expert (a plain tiny checkpoint: no recipe tokens yet)
and returns the first policy request of each rollout. :func:`fixed_texts` keeps the paragraphs that every captured
request repeats verbatim (system prompt, the text around the task) and drops those that hold the day's date; the
tools are the request's, when every request offers the same. :func:`harness_texts` caches the result per harness
identity (``<cache>/harness-texts/<key>.json``) as a :class:`CapturedTexts`, which
:func:`repro.tinymodel.recipe.resolve_model_config` takes as a recipe harness.
"""

from __future__ import annotations

import datetime as dt
import difflib
import hashlib
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness_adapters.template_texts import MIN_PIECE_CHARS, paragraphs
from repro.common.files import cache_dir, locked

CAPTURE_TASKS = 2
TEXTS_VERSION = 2  # bump when what is kept of the captured requests changes (part of the cache key)
SHARED_MIN_CHARS = 24  # the shortest run a differing paragraph shares that becomes a text
_DATE_FORMATS = ("%Y-%m-%d", "%a %b %d %Y", "%B %d, %Y", "%d %B %Y", "%m/%d/%Y", "%d/%m/%Y", "%Y/%m/%d")


@dataclass(frozen=True)
class CapturedTexts:
    """A recipe harness (``fixed_prompt_texts``, ``tools``) from captured requests."""

    texts: tuple[str, ...]
    tool_list: tuple[dict[str, Any], ...]

    def fixed_prompt_texts(self, platform_line: bool = False) -> list[str]:
        """The paragraphs every captured request repeats (``platform_line`` has no meaning here)."""
        return list(self.texts)

    def tools(self) -> list[dict[str, Any]]:
        """The tools the harness offers in every captured request."""
        return [dict(tool) for tool in self.tool_list]


def message_text(message: dict[str, Any]) -> str:
    """A chat message's text: its string content, or its text parts joined (OpenHands sends lists of parts)."""
    content = message.get("content")
    if isinstance(content, list):
        return "\n\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _dated(text: str, day: dt.date) -> bool:
    return any(day.strftime(f) in text for f in _DATE_FORMATS)


def fixed_texts(requests: list[dict[str, Any]], day: dt.date | None = None) -> CapturedTexts:
    """What every request of ``requests`` repeats: the paragraphs (:func:`paragraphs`) of their messages common
    to all of them, without any that holds ``day``'s date (default today); their tools when all offer the same."""
    day = day or dt.date.today()
    if not requests:
        raise ValueError("no captured request to take fixed texts from")
    sets = [{p for m in r.get("messages", []) for p in paragraphs(message_text(m))} for r in requests]
    common = set.intersection(*sets) | shared_pieces(sets)
    tools = [r.get("tools") or [] for r in requests]
    same = all(json.dumps(t, sort_keys=True) == json.dumps(tools[0], sort_keys=True) for t in tools)
    if not same:  # a tool names the working copy (OpenHands' file_editor): the block's lines all share, instead
        common |= tool_block_lines(tools)
    return CapturedTexts(tuple(sorted(p for p in common if not _dated(p, day))),
                         tuple(tools[0]) if same else ())


def shared_pieces(sets: list[set[str]]) -> set[str]:
    """Where a paragraph differs between requests only by the rollout's own text (its working copy's path, the date,
    a home folder): the runs of at least :data:`SHARED_MIN_CHARS` characters it shares with its closest paragraph
    in every other request (each such paragraph of the first request against each other request)."""
    first, others = sets[0], sets[1:]
    pieces: set[str] = set()
    for paragraph in sorted(first - set.intersection(*sets)):
        runs = {paragraph}
        for other in others:
            match = max(other, key=lambda o: difflib.SequenceMatcher(None, paragraph, o, autojunk=False).ratio(),
                        default=None)
            if match is None:
                runs = set()
                break
            runs = {piece for run in runs for piece in _common_runs(run, match)}
        pieces |= runs
    return pieces


def _common_runs(a: str, b: str) -> set[str]:
    """The runs ``a`` and ``b`` share, each cut back to whole words where it meets a difference (so no run ends in
    the part of a path two rollouts happen to share, which would make the tokenizer depend on this machine)."""
    runs = set()
    for m in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks():
        run = a[m.a:m.a + m.size]
        if m.a > 0 or m.b > 0:  # starts after a difference: drop the partial word
            run = run[len(run.split(None, 1)[0]):] if run.strip() and not run[0].isspace() else run
        if m.a + m.size < len(a) or m.b + m.size < len(b):
            run = run[:len(run) - len(run.rsplit(None, 1)[-1])] if run.strip() and not run[-1].isspace() else run
        if len(run.strip()) >= SHARED_MIN_CHARS:
            runs.add(run.strip())
    return runs


def tool_block_lines(tool_sets: list[list[dict[str, Any]]]) -> set[str]:
    """For requests whose tools differ: the lines of our chat template's tools block (its instructions, one tool
    a line) that every request's block has, and the wrapper of a call of each tool of the first request."""
    from repro.tinymodel.vocab import render_chat, tool_call_pieces

    blocks = [render_chat([{"role": "user", "content": "x"}], tools) for tools in tool_sets]
    lines = [{line.strip() for line in block.splitlines()} for block in blocks]
    common = set.intersection(*lines) | shared_pieces(lines)
    pieces = {piece for tool in tool_sets[0] for piece in tool_call_pieces(
        tool.get("function", tool)["name"], next(iter(tool.get("function", tool).get("parameters", {}).get(
            "properties", {}) or {"command": None})))}
    return {line for line in common | pieces if len(line) >= MIN_PIECE_CHARS}


def capture_requests(name: str, cfg: Any, n_tasks: int = CAPTURE_TASKS) -> list[dict[str, Any]]:
    """The first policy request of each of ``n_tasks`` rollouts of the harness ``name`` (config ``cfg``)."""
    from harness_adapters.registry import get_harness
    from repro.recipe.expert_runs import expert_stack, locate_tasks, run_tasks
    from repro.store import open_store

    tasks = locate_tasks(n_tasks)
    with tempfile.TemporaryDirectory(prefix="repro-capture-") as tmp:
        root = Path(tmp)
        with get_harness(name, cfg) as harness, expert_stack(tasks, root) as stack:
            reports = run_tasks(harness, stack, tasks, root / "run", root / "traces.sqlite", experiment="capture")
        store = open_store(root / "traces.sqlite")
        try:
            firsts = [next((c.request for c in store.calls(r.rollout_id) if c.purpose == "policy"), None)
                      for r in reports]
        finally:
            store.close()
    missing = [r.rollout_id for r, first in zip(reports, firsts, strict=True) if first is None]
    if missing:
        raise RuntimeError(f"{name}: no policy call recorded for {missing}; see the harness's reasons "
                           f"{[r.harness_reason for r in reports]}")
    return [first for first in firsts if first is not None]


def harness_texts(name: str, cfg: Any, identity: dict[str, Any]) -> CapturedTexts:
    """The captured fixed texts of the harness with ``identity`` (cached by it; captured on first use)."""
    key = hashlib.sha256(json.dumps({"name": name, "identity": identity, "version": TEXTS_VERSION}, sort_keys=True,
                                    default=str).encode()).hexdigest()[:16]
    path = cache_dir() / "harness-texts" / f"{key}.json"
    with locked(path.with_suffix(".lock")):
        if not path.exists():
            captured = fixed_texts(capture_requests(name, cfg))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"harness": name, "texts": captured.texts, "tools": captured.tool_list},
                                       indent=1, ensure_ascii=False))
        data = json.loads(path.read_text())
    return CapturedTexts(tuple(data["texts"]), tuple(data["tools"]))

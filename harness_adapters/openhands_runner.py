"""One OpenHands rollout, run INSIDE the OpenHands harness env (Python >= 3.12, ``openhands-sdk`` +
``openhands-tools``): ``python -P openhands_runner.py SPEC.json``.

It drives the SDK's default agent unchanged, as OpenHands' own benchmarks do: ``get_default_agent(llm,
cli_mode=True)`` (tools ``terminal``, ``file_editor``, ``task_tracker`` + the built-in ``finish`` and ``think``),
a ``Conversation`` over a ``LocalWorkspace``, one ``send_message(task)`` and ``run()``. The only changes are the
ones the adapter's settings stand for: the condenser (the default one is ``LLMSummarizingCondenser(max_size=80,
keep_first=4)`` over a copy of the agent's LLM; here its settings come from the spec and its LLM, same model,
points at the proxy's ``summary`` purpose URL so its calls are recorded apart) and the console visualizer
(off: it only prints). Imports nothing from ``repro`` (it runs in another interpreter).

The spec (JSON) holds ``task``, ``workdir``, ``output_dir``, ``model``, ``base_url``, ``summary_base_url``,
``max_iterations``, ``condenser`` (``kind`` none|summarizing|default, ``max_size``, ``keep_first``), ``llm``
(extra ``LLM`` fields: temperature, max_output_tokens, num_retries, timeout, ...) and ``terminal`` (tool params,
e.g. ``no_change_timeout_seconds``; empty = the default agent's) and ``jail`` (true: it runs in the adapter's jail,
whose ``/dev`` has no pty devices; it mounts a devpts of its own first, as the terminal tool's tmux needs ptys).
The API key comes from ``OPENAI_API_KEY``. After the run it unlinks the sockets of tmux servers that have exited, so
those left under ``TMUX_TMPDIR`` are servers still running (the adapter kills them, or the jail's end did).

Writes ``<output_dir>/result.json``: ``exit_status`` (``finished`` | ``max_iterations`` | ``stuck`` | ``error``),
``execution_status``, ``n_llm_calls`` (per usage id), ``events_path`` (one JSON event per line, appended as the
agent goes, so a killed run keeps its log), ``error`` / ``traceback``, timings. Exit code 0 unless the spec
could not be read or the result not written.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)  # this folder holds the adapter's openhands.py, which would shadow the SDK's package

RESULT_NAME = "result.json"
EVENTS_NAME = "events.jsonl"


def unlink_dead_tmux_sockets() -> int:
    """Unlink every tmux socket under ``$TMUX_TMPDIR`` whose server no longer answers; return how many."""
    removed = 0
    for path in Path(os.environ.get("TMUX_TMPDIR", "/tmp")).glob("tmux-*/*"):
        if not path.is_socket():
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(path))
                continue
            except OSError:
                pass
        try:
            path.unlink()
            removed += 1
        except OSError:
            pass
    return removed


def build_llms(spec: dict[str, Any]) -> tuple[Any, Any]:
    """The agent's LLM and the condenser's (same model and settings, the ``summary`` purpose URL)."""
    from openhands.sdk import LLM
    from pydantic import SecretStr

    key = SecretStr(os.environ.get("OPENAI_API_KEY", "sk-dummy"))
    extra = dict(spec.get("llm") or {})
    agent_llm = LLM(model=spec["model"], base_url=spec["base_url"], api_key=key, usage_id="agent", **extra)
    summary_url = spec.get("summary_base_url") or spec["base_url"]
    summary_llm = LLM(model=spec["model"], base_url=summary_url, api_key=key, usage_id="condenser", **extra)
    return agent_llm, summary_llm


def build_agent(spec: dict[str, Any]) -> Any:
    """The default agent (CLI mode) with the spec's condenser and terminal settings."""
    from openhands.sdk import Tool
    from openhands.sdk.context.condenser import LLMSummarizingCondenser
    from openhands.tools.preset.default import get_default_agent

    agent_llm, summary_llm = build_llms(spec)
    agent = get_default_agent(agent_llm, cli_mode=True)
    update: dict[str, Any] = {}
    condenser = spec.get("condenser") or {}
    kind = condenser.get("kind", "default")
    if kind == "none":
        update["condenser"] = None
    elif kind == "summarizing":
        by_tokens = {"max_tokens": int(condenser["max_tokens"])} if condenser.get("max_tokens") else {}
        update["condenser"] = LLMSummarizingCondenser(
            llm=summary_llm, max_size=int(condenser["max_size"]), keep_first=int(condenser["keep_first"]), **by_tokens)
    elif kind == "default":
        base = agent.condenser
        update["condenser"] = base.model_copy(update={"llm": summary_llm}) if base is not None else None
    else:
        raise ValueError(f"unknown condenser kind {kind!r}: none | summarizing | default")
    terminal = dict(spec.get("terminal") or {})
    if terminal:
        update["tools"] = [Tool(name=t.name, params={**t.params, **terminal}) if t.name == "terminal" else t
                           for t in agent.tools]
    return agent.model_copy(update=update)


def count_calls(conversation: Any) -> dict[str, int]:
    """LLM calls made so far, per usage id (``agent``, ``condenser``), from the conversation's metrics."""
    stats = conversation.conversation_stats.usage_to_metrics
    return {usage: len(metrics.response_latencies) for usage, metrics in stats.items()}


def exit_status_of(conversation: Any) -> tuple[str, str]:
    """(our word, the SDK's execution status) for a conversation whose ``run()`` returned."""
    status = str(getattr(conversation.state.execution_status, "value", conversation.state.execution_status))
    if status == "finished":
        return "finished", status
    if status == "stuck":
        return "stuck", status
    codes = [getattr(e, "code", "") for e in conversation.state.events if type(e).__name__ == "ConversationErrorEvent"]
    if "MaxIterationsReached" in codes:
        return "max_iterations", status
    return "error", status


class EventLog:
    """Appends each event as one JSON line (flushed), so the log survives a killed process."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())
        self.count = 0

    def __call__(self, event: Any) -> None:
        try:
            line = event.model_dump_json()
        except Exception as exc:  # a log line must never break the agent
            line = json.dumps({"kind": type(event).__name__, "unserializable": str(exc)})
        self._handle.write(line + "\n")
        self._handle.flush()
        self.count += 1

    def close(self) -> None:
        self._handle.close()


def run_rollout(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the conversation; the result dict (never raises for an agent-side error)."""
    from openhands.sdk import Conversation
    from openhands.sdk.workspace import LocalWorkspace

    out = Path(spec["output_dir"])
    log = EventLog(out / EVENTS_NAME)
    result: dict[str, Any] = {"events_path": str(log.path), "persistence_dir": str(out / "conversation")}
    started, conversation = time.monotonic(), None
    try:
        agent = build_agent(spec)
        conversation = Conversation(
            agent=agent, workspace=LocalWorkspace(working_dir=spec["workdir"]), persistence_dir=out / "conversation",
            callbacks=[log], max_iteration_per_run=int(spec["max_iterations"]), visualizer=None)
        conversation.send_message(spec["task"])
        conversation.run()
        result["exit_status"], result["execution_status"] = exit_status_of(conversation)
    except Exception as exc:
        result |= {"exit_status": "error", "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc()}
        if conversation is not None:
            result["execution_status"] = str(getattr(conversation.state.execution_status, "value", ""))
    finally:
        if conversation is not None:
            result["n_llm_calls"] = count_calls(conversation)
            result["conversation_id"] = str(conversation.id)
            _close_quietly(conversation)
        log.close()
    result |= {"n_events": log.count, "duration_s": round(time.monotonic() - started, 3)}
    return result


def _close_quietly(conversation: Any) -> None:
    try:
        conversation.close()
    except Exception as exc:  # cleanup only: the adapter also kills the rollout's tmux server
        print(f"conversation.close() failed: {exc!r}", file=sys.stderr)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: openhands_runner.py SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    out = Path(spec["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    result = run_rollout(spec)
    unlink_dead_tmux_sockets()
    tmp = out / f"{RESULT_NAME}.tmp"
    tmp.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, out / RESULT_NAME)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

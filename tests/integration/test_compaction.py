"""Compaction under the proxy, at the served model's real window: each harness that compacts is driven past the CPU
server's ``max_model_len`` by a scripted model whose steps return hundreds to thousands of tokens of output, and its
compacted call is read back from the trace store (mini-SWE-agent has no compaction; OpenCode's is in
``test_opencode_harness``).

- OpenHands (the default agent's ``LLMSummarizingCondenser``, sizes 80 / 4): the proxy refuses the over-long call
  with chat completions' ``context_length_exceeded``; LiteLLM raises ``ContextWindowExceededError``, the agent turns
  it into a condensation request, and the condenser's summary call (purpose ``summary``) is followed by a policy
  call shorter than the last one answered. Control: without the condenser it ends on the refusal.
- Codex CLI, Claude Code, Qwen Code, each with ``compacting_below(window, margin)``: the compaction call (no tools,
  or the CLI's "text only" instruction) comes before any refusal and the next call resumes from its summary.
  Controls: with their defaults Codex ends on the refusal (``context_exceeded``), Claude Code and Qwen Code compact
  only after one.

Each case is one rollout of one bundled task, run by ``Evaluator`` as a frozen evaluation would run it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from harness_adapters.cli_agents import ClaudeCodeConfig, CodexConfig, QwenCodeConfig
from harness_adapters.node_cli_env import SPECS
from harness_adapters.openhands import OpenHandsConfig, ensure_openhands_env
from harness_adapters.registry import get_harness
from repro.common.venvs import HarnessEnvError
from repro.proxy import ProxyConfig
from repro.rl.evaluator import EvalConfig, Evaluator, build_spec
from repro.sandbox.local import LocalSandbox, LocalSandboxConfig
from repro.serving.stack import CpuServingConfig, running_stack
from repro.store import open_store
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.tinymodel.model import TinyModelConfig, build_tiny_model
from repro.train.samples.rows import fragments
from tests.support import installed_node_cli

MODEL = TinyModelConfig(vocab_size=1024, max_position_embeddings=65536)
TASKS = TaskDistributionConfig(seed=0, split="test", n_tasks=1, families=["procedural"])
MAX_TOKENS = 256  # forced on every call of the evaluation (the window must hold the prompt and these)
STEPS = 12  # distinct commands (a repeated one trips OpenHands' stuck detector)


def step_commands() -> list[str]:
    """~3k tokens of output a step; the marker (for the summary's reply) reaches the summary prompt."""
    return [f"echo 'SCENARIO condensed.'; seq {i} {i + 700}" for i in range(1, STEPS + 1)]


SUMMARY = "Summary: the agent printed numbers; nothing is fixed yet."


def tool_call(name: str, **arguments: object) -> str:
    """A scripted completion calling one tool (Hermes format, as the CPU server's parser reads it)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@dataclass
class Compacted:
    """One rollout driven past the window: its evaluation report and its calls as the proxy stored them."""

    report: Any
    calls: list[Any]
    window: int


def drive(name: str, cfg: Any, scenarios: dict[str, list[str]], window: int, root: Path) -> Compacted:
    """Evaluate one task (marked ``SCENARIO window.``) in harness ``name`` on a server of ``window`` tokens whose
    replies are ``scenarios`` (``repro.serving.scripted.scenario_script``: the first marker found wins)."""
    root.mkdir(parents=True)
    (root / "scenarios.json").write_text(json.dumps(scenarios))
    model_dir = build_tiny_model(root / "model", MODEL, [])
    tasks = [replace(t, problem_statement=f"SCENARIO window. {t.problem_statement}") for t in build_distribution(TASKS)]
    ev = EvalConfig(experiment="compaction", max_tokens=MAX_TOKENS, concurrency=1)
    sandbox = LocalSandbox(LocalSandboxConfig())
    try:
        with get_harness(name, cfg) as harness, running_stack(
                model_dir, CpuServingConfig(), ProxyConfig(port=0), root,
                server_overrides={"scenarios": root / "scenarios.json", "max_model_len": window}) as stack:
            spec = build_spec(harness, "bundled", tasks, LocalSandboxConfig(), ev, 0, stack.served_model_name)
            (report,) = Evaluator(stack, harness, sandbox, ev, spec=spec).evaluate(tasks, root / "run").reports
    finally:
        sandbox.close()
    store = open_store(root / "traces.sqlite")
    calls = store.calls(report.rollout_id)
    store.close()
    return Compacted(report, calls, window)


def assert_chains(run: Compacted, compaction_seq: int) -> None:
    """The rollout's rows (``prefix_merge``): the compaction call and the call after it start chains of their own,
    and every sampled token of the answered calls is in exactly one row."""
    rows, skipped = fragments(run.calls)
    starts = {row.call_seqs[0] for row in rows}
    assert {compaction_seq, compaction_seq + 1} <= starts and len(rows) >= 3, [r.call_seqs for r in rows]
    answered = [c for c in run.calls if c.status == "ok"]
    assert sorted(s for r in rows for s in r.call_seqs) == [c.seq for c in answered]
    assert sum(r.n_sampled for r in rows) == sum(len(c.completion_ids) for c in answered)
    assert {s.seq for s in skipped} == {c.seq for c in run.calls} - {c.seq for c in answered}


def refused_then_compacted(run: Compacted) -> tuple[Any, Any, Any, Any]:
    """(the last policy call answered before the first refusal, the refused call (stored without token ids), the
    summary call after it, the next policy call after that)."""
    refused = next(c for c in run.calls if c.status == "context_exceeded")
    before = [c for c in run.calls if c.seq < refused.seq and c.purpose == "policy"][-1]
    later = [c for c in run.calls if c.seq > refused.seq]
    summary = next(c for c in later if c.purpose == "summary")
    resumed = next(c for c in later if c.purpose == "policy" and c.seq > summary.seq)
    return before, refused, summary, resumed


def with_and_without(factory: pytest.TempPathFactory, name: str, cfg: Any, window: int, margin: int,
                     scenarios: dict[str, list[str]]) -> dict[str, Compacted]:
    """The CLI ``name`` driven past ``window`` set to compact ``margin`` below it (``window``) and as it comes
    (``default``)."""
    installed_node_cli(SPECS[name])  # skipped (one line why) where npm cannot install it; CI requires it
    root = factory.mktemp(name)
    return {"window": drive(name, cfg.compacting_below(window, margin), scenarios, window, root / "window"),
            "default": drive(name, cfg, scenarios, window, root / "default")}


# OpenHands' first prompt is ~20.9k tokens of the tiny byte-level tokenizer; its 6th call passes 36k. Iterations:
# 5 steps, the refused one, the condensation, 2 steps after it (it ends on an answered call).
OPENHANDS_WINDOW = 36_000
OPENHANDS = OpenHandsConfig(max_iterations=9, condenser="summarizing", num_retries=0)


@pytest.fixture(scope="module")
def openhands(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Compacted]:
    try:
        ensure_openhands_env(OPENHANDS.version)
    except HarnessEnvError as exc:
        pytest.skip(f"OpenHands env unavailable: {exc}")
    root = tmp_path_factory.mktemp("openhands")
    scenarios = {"window": [tool_call("terminal", command=c, security_risk="LOW") for c in step_commands()],
                 "condensed": [SUMMARY]}  # the summary prompt has no task in it, the steps' marker only
    return {"condenser": drive("openhands", OPENHANDS, scenarios, OPENHANDS_WINDOW, root / "condenser"),
            "none": drive("openhands", replace(OPENHANDS, condenser="none"), scenarios, OPENHANDS_WINDOW,
                          root / "none")}


def test_openhands_condenses_when_the_window_refuses_a_call(openhands: dict[str, Compacted]) -> None:
    run = openhands["condenser"]
    before, refused, summary, resumed = refused_then_compacted(run)
    assert f"maximum context length is {run.window} tokens" in refused.error
    assert summary.status == "ok" and "tools" not in summary.request
    assert [m["role"] for m in summary.request["messages"]] == ["system", "user"]
    assert resumed.status == "ok" and len(resumed.prompt_ids) < len(before.prompt_ids)
    assert resumed.prompt_ids != before.prompt_ids[:len(resumed.prompt_ids)]  # not a shortened copy: a summary
    assert_chains(run, summary.seq)
    report = run.report
    assert report.context_refusals >= 1 and not report.context_exceeded and not report.infra_failure, report


def test_openhands_without_a_condenser_ends_on_the_refusal(openhands: dict[str, Compacted]) -> None:
    """Control: the condenser is what recovers; without it the same rollout ends with ``context_exceeded``."""
    run = openhands["none"]
    assert [c.purpose for c in run.calls] == ["policy"] * len(run.calls)
    assert run.calls[-1].status == "context_exceeded"
    assert run.report.context_exceeded and run.report.context_exceeded_seq == run.calls[-1].seq, run.report


# Codex 0.169.0 compacts on its own token count only (CodexConfig.compacting_below): the last call's reported usage
# plus its estimate of the items since (~4 bytes a token: the tiny tokenizer's ~1 makes it count a tool output at
# ~1/4). A refused call is not compacted: Codex ends ("ran out of room"). So the margin is twice the largest step
# and ~1k more: the compaction call carries one more tool output than the call before it. Lean Codex's first prompt is
# ~13.5k tokens; each `seq 1 1500` step ~6.5k; calls of ~13.5k, 20k, 26.6k, then the compaction call (~30.7k, no
# tools, a user message "You are performing a CONTEXT CHECKPOINT COMPACTION..."), on turn 4: 3 tool outputs + it.
CODEX_WINDOW, CODEX_MARGIN, CODEX_STEP = 36_000, 10_000, "seq 1 1500"
CODEX = CodexConfig(lean=True)
CODEX_COMPACTION = "You are performing a CONTEXT CHECKPOINT COMPACTION"
CODEX_RESUMED = "Another language model started to solve this problem and produced a summary"


def codex_scenarios() -> dict[str, list[str]]:
    """Steps on turns 0-3, the summary on turn 4 (the compaction call's); prompts that carry the summary (its
    marker) get the answer."""
    step = tool_call("exec_command", cmd=CODEX_STEP)
    return {"after": ["Done after compaction."], "window": [step] * 4 + [f"SCENARIO after. {SUMMARY}"]}


@pytest.fixture(scope="module")
def codex(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Compacted]:
    return with_and_without(tmp_path_factory, "codex", CODEX, CODEX_WINDOW, CODEX_MARGIN, codex_scenarios())


def test_codex_compacts_below_the_window(codex: dict[str, Compacted]) -> None:
    run = codex["window"]
    assert all(c.status == "ok" for c in run.calls), [(c.seq, c.status, c.error) for c in run.calls]
    (compaction,) = [c for c in run.calls if CODEX_COMPACTION in json.dumps(c.request["messages"][-1])]
    assert not compaction.request.get("tools") and compaction.streamed
    before = run.calls[compaction.seq - 1]
    resumed = run.calls[compaction.seq + 1]
    assert len(before.prompt_ids) < len(compaction.prompt_ids) < run.window  # the compaction call fits
    assert CODEX_RESUMED in json.dumps(resumed.request["messages"]) and SUMMARY in json.dumps(resumed.request)
    assert len(resumed.prompt_ids) < len(before.prompt_ids) and resumed.extends_previous is False
    assert run.report.harness_status == "finished" and run.report.context_refusals == 0, run.report
    assert_chains(run, compaction.seq)


def test_codex_without_the_settings_ends_on_the_refusal(codex: dict[str, Compacted]) -> None:
    """Control: the same model with Codex's defaults (a window it takes for unbounded) grows past the server's."""
    run = codex["default"]
    assert not any(CODEX_COMPACTION in json.dumps(c.request["messages"][-1]) for c in run.calls)
    assert run.calls[-1].status == "context_exceeded"
    assert run.report.context_exceeded and run.report.context_exceeded_seq == run.calls[-1].seq, run.report


# Qwen Code 0.24.4's first prompt is ~45.8k tokens; each step ~2.5k. It compresses a refused call and retries it
# (any settings); compacting_below sets its contextWindowSize so that it compresses before the window.
QWEN_WINDOW, QWEN_MARGIN = 60_000, 4_000
QWEN_COMPRESSION = "You are the component that summarizes a conversation"
# A reply carries the summary it would give if asked for one: a compression prompt (the history and a directive)
# holds the task's marker like any other, so every reply is a <state_snapshot> (a policy reply may not start with
# one: Qwen Code rejects protocol tags there) and then the step; after compression only the summary's marker is left.
QWEN_SNAPSHOT = f"Progress so far.\n<state_snapshot>\n<overall_goal>SCENARIO after. {SUMMARY}</overall_goal>\n" \
                "</state_snapshot>\n"


def qwen_scenarios() -> dict[str, list[str]]:
    steps = [QWEN_SNAPSHOT + tool_call("run_shell_command", command=f"echo step{i}; seq 1 600") for i in range(10)]
    return {"window": [*steps, "Done without compression."], "after": ["Done after compression."]}


def qwen_compression_calls(run: Compacted) -> list[Any]:
    return [c for c in run.calls if QWEN_COMPRESSION in json.dumps(c.request["messages"][0])]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Compacted]:
    cfg = QwenCodeConfig(max_output_tokens=128)
    return with_and_without(tmp_path_factory, "qwen-code", cfg, QWEN_WINDOW, QWEN_MARGIN, qwen_scenarios())


def test_qwen_code_compresses_before_the_window(qwen: dict[str, Compacted]) -> None:
    run = qwen["window"]
    assert all(c.status == "ok" for c in run.calls), [(c.seq, c.status, c.error) for c in run.calls]
    (compression,) = qwen_compression_calls(run)
    assert not compression.request.get("tools") and compression.streamed
    before, resumed = run.calls[compression.seq - 1], run.calls[compression.seq + 1]
    assert len(resumed.prompt_ids) < len(before.prompt_ids) and resumed.extends_previous is False
    assert SUMMARY in json.dumps(resumed.request["messages"]) and resumed.request.get("tools")
    assert run.report.harness_status == "finished" and run.report.context_refusals == 0, run.report
    assert_chains(run, compression.seq)


def test_qwen_code_by_default_compresses_only_a_refused_call(qwen: dict[str, Compacted]) -> None:
    """Control: with its own window (the model's unknown: a large default) the first compression follows a refusal,
    and the retried call fits."""
    run = qwen["default"]
    first = qwen_compression_calls(run)[0]
    refused = [c for c in run.calls if c.status == "context_exceeded"]
    assert refused and refused[0].seq < first.seq, [(c.seq, c.status) for c in run.calls]
    assert run.calls[-1].status == "ok" and not run.report.context_exceeded and run.report.context_refusals >= 1


# Claude Code 2.1.328 compacts before a call whose estimate (~4 characters a token for what is new) passes its
# threshold (ClaudeCodeConfig.compacting_below); a refused call is compacted too, and retried. The margin holds the
# summary instruction (~3.9k tokens), the call's max_tokens and the overshoot of the estimate. Bare, Bash only:
# the first prompt is ~1.6k tokens; each step ~0.8k.
CLAUDE_WINDOW, CLAUDE_MARGIN, CLAUDE_MAX_OUTPUT = 8_000, 5_000, MAX_TOKENS
CLAUDE = ClaudeCodeConfig(bare=True, tools=["Bash"], max_output_tokens=CLAUDE_MAX_OUTPUT,
                          system_prompt="You are a coding agent. Use the Bash tool to inspect and fix the repository.")
CLAUDE_COMPACTION = "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools."
CLAUDE_RESUMED = "This session is being continued from a previous conversation"


def claude_scenarios(steps: int = 10) -> dict[str, list[str]]:
    """Step i prints the marker ``p{i}``; the latest one names the scenario (listed latest first), so a policy call
    after g steps is turn g of ``p{g}`` (step g + 1) and a compaction request made of those g rounds and its
    instruction is turn g + 1 (the summary, in the tags Claude Code asks for)."""
    def step(i: int) -> str:
        command = f"echo 'SCENARIO p{i}.'; seq {i} {i + 200}"
        return tool_call("Bash", command=command, description="list") if i <= steps else "Done."

    summary = f"<analysis>Nothing to analyse.</analysis>\n<summary>SCENARIO after. {SUMMARY}</summary>"
    scenarios = {"after": ["Done after compaction."]}
    scenarios |= {f"p{g}": [""] * g + [step(g + 1), summary] for g in range(steps, 0, -1)}
    return scenarios | {"window": [step(1), summary]}


def claude_compactions(run: Compacted) -> list[Any]:
    return [c for c in run.calls if CLAUDE_COMPACTION in json.dumps(c.request["messages"][-1])]


@pytest.fixture(scope="module")
def claude(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Compacted]:
    return with_and_without(tmp_path_factory, "claude-code", CLAUDE, CLAUDE_WINDOW, CLAUDE_MARGIN, claude_scenarios())


def test_claude_code_compacts_below_the_window(claude: dict[str, Compacted]) -> None:
    run = claude["window"]
    assert all(c.status == "ok" for c in run.calls), [(c.seq, c.status, c.error) for c in run.calls]
    (compaction,) = claude_compactions(run)
    before, resumed = run.calls[compaction.seq - 1], run.calls[compaction.seq + 1]
    assert compaction.request["messages"][:-1] == before.request["messages"]  # the history, then its instruction
    assert CLAUDE_RESUMED in json.dumps(resumed.request["messages"]) and SUMMARY in json.dumps(resumed.request)
    assert len(resumed.prompt_ids) < len(before.prompt_ids) and resumed.extends_previous is False
    assert run.report.harness_status == "finished" and run.report.context_refusals == 0, run.report
    assert_chains(run, compaction.seq)


def test_claude_code_by_default_compacts_only_a_refused_call(claude: dict[str, Compacted]) -> None:
    """Control: with the window it assumes for an unknown model (1M tokens) the first compaction follows a
    refusal."""
    run = claude["default"]
    refused = [c.seq for c in run.calls if c.status == "context_exceeded"]
    compactions = [c.seq for c in claude_compactions(run)]
    assert refused and compactions and refused[0] < compactions[0], [(c.seq, c.status) for c in run.calls]
    assert not run.report.infra_failure, run.report

"""The rebuilt loop's pieces: token-in/token-out conversation state, prompt comparison, the loop's own exits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from harness_adapters.mini_swe_agent.adapter import MiniSweAgentConfig
from repro.rl.rebuilt.conversation import TokenConversation
from repro.rl.rebuilt.fidelity import RolloutFidelity, compare, summarize
from repro.rl.rebuilt.harness import LoopConfig, loop_spec
from repro.rl.rebuilt.mini_swe_agent import Completion, LoopSpec, RebuiltLoop
from repro.tinymodel.expert import tool_call_text

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
FIRST = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix x.py"}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _sampled(tokenizer: Any, text: str) -> list[int]:
    return [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]


def _assistant(command: str) -> dict[str, Any]:
    call = {"id": "c1", "type": "function",
            "function": {"name": "bash", "arguments": '{"command": "' + command + '"}'}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def test_canonical_turns_keep_ids_equal_to_a_fresh_render(tokenizer: Any) -> None:
    conv = TokenConversation(tokenizer, TOOLS, FIRST)
    assert conv.prompt_ids() == conv.rendered_ids()
    conv.add_completion(_sampled(tokenizer, tool_call_text("ls")), _assistant("ls"))
    conv.add_messages([{"role": "tool", "tool_call_id": "c1", "content": "x.py"}])
    assert conv.prompt_ids() == conv.rendered_ids()


def test_non_canonical_sampled_ids_are_kept_and_show_as_drift(tokenizer: Any) -> None:
    conv = TokenConversation(tokenizer, TOOLS, FIRST)
    canonical = tokenizer.encode(tool_call_text("ls"), add_special_tokens=False)
    # the same text spelled one character per token: what a sampler may produce, never what encode() gives
    spelled = [t for ch in tokenizer.decode(canonical) for t in tokenizer.encode(ch, add_special_tokens=False)]
    assert tokenizer.decode(spelled) == tokenizer.decode(canonical) and spelled != canonical
    conv.add_completion([*spelled, tokenizer.eos_token_id], _assistant("ls"))
    assert conv.ids[-len(spelled) - 2:-2] == spelled  # never re-encoded
    assert conv.prompt_ids() != conv.rendered_ids()


def test_a_turn_cut_by_max_tokens_is_closed_like_the_template(tokenizer: Any) -> None:
    conv = TokenConversation(tokenizer, TOOLS, FIRST)
    conv.add_completion(tokenizer.encode("partial", add_special_tokens=False),
                        {"role": "assistant", "content": "partial"})
    assert conv.prompt_ids() == conv.rendered_ids()


def test_compare_finds_the_first_difference_with_an_excerpt(tokenizer: Any) -> None:
    a = tokenizer.encode("the quick brown fox", add_special_tokens=False)
    b = tokenizer.encode("the quick red fox", add_special_tokens=False)
    check = compare(2, a, b, tokenizer)
    first = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert not check.identical and check.first_diff == first
    assert "⟦" in check.harness_excerpt and "brown" in check.harness_excerpt and "red" in check.rebuilt_excerpt
    assert compare(0, a, list(a), tokenizer).identical
    missing = compare(3, a, None, tokenizer)
    assert not missing.identical and missing.rebuilt_tokens is None
    assert compare(1, a, a[:-1], tokenizer).first_diff == len(a) - 1  # a prefix differs where it ends


def test_summary_counts_turns_and_first_divergences(tokenizer: Any) -> None:
    ids = [1, 2, 3]
    same, other = compare(0, ids, ids, tokenizer), compare(1, ids, [1, 2, 4], tokenizer)
    results = [RolloutFidelity("r0", "2.4.6", "Submitted", [same]),
               RolloutFidelity("r1", "2.4.6", "Submitted", [same, other])]
    summary = summarize(results)
    assert (summary["turns"], summary["divergent_turns"], summary["rollouts_diverged"]) == (3, 1, 1)
    assert summary["divergence_rate"] == pytest.approx(1 / 3) and summary["first_divergent_turns"] == [1]
    assert summary["example"]["rollout_id"] == "r1"


class _Script:
    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        self.tokenizer, self.replies, self.prompts = tokenizer, replies, []

    def complete(self, prompt_ids: list[int]) -> Completion:
        text = self.replies[min(len(self.prompts), len(self.replies) - 1)]
        self.prompts.append(prompt_ids)
        return Completion(prompt_ids, _sampled(self.tokenizer, text), text, "stop")


def _spec(**limits: Any) -> LoopSpec:
    return LoopSpec("sys", "{{task}}", "{{output.returncode}}: {{output.output}}", "error: {{error}}", TOOLS,
                    command_env={"PATH": "/usr/bin:/bin"}, **limits)


@pytest.mark.parametrize("replies, limits, expected", [
    ([tool_call_text("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")], {}, ("Submitted", 1)),
    ([tool_call_text("true")], {"step_limit": 2}, ("LimitsExceeded", 2)),
    (["no call"], {"max_format_errors": 3}, ("RepeatedFormatError", 3)),
    ([tool_call_text("sleep 1.1")], {"wall_time_limit_s": 1}, ("TimeExceeded", 1)),
])
def test_loop_exits(tokenizer: Any, tmp_path: Path, replies: list[str], limits: dict, expected: tuple) -> None:
    model = _Script(tokenizer, replies)
    loop = RebuiltLoop(_spec(**limits), tokenizer, model, tmp_path)
    assert (loop.run("fix it"), loop.n_calls) == expected


def test_a_format_error_drops_the_reply_from_the_history(tokenizer: Any, tmp_path: Path) -> None:
    model = _Script(tokenizer, ["no call", tool_call_text("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")])
    loop = RebuiltLoop(_spec(), tokenizer, model, tmp_path)
    assert loop.run("fix it") == "Submitted"
    second = tokenizer.decode(model.prompts[1])
    assert "no call" not in second and "error: No tool calls found" in second
    assert [m["role"] for m in loop.conversation.messages] == ["system", "user", "user", "assistant"]


def test_loop_config_and_spec_refuse_what_they_cannot_do() -> None:
    with pytest.raises(ValueError, match=r"loop\.kind"):
        LoopConfig("verl")
    with pytest.raises(ValueError, match="max_tokens"):
        loop_spec(MiniSweAgentConfig(max_tokens=None), Path("/tmp"))
    with pytest.raises(ValueError, match="tool-call mode"):
        loop_spec(MiniSweAgentConfig(mode="text", max_tokens=32), Path("/tmp"))

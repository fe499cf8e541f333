"""How faithful is the rebuilt loop? Replay recorded real-harness rollouts through it and compare prompts.

For each recorded rollout the rebuilt loop runs on the same task in a fresh workspace, but its model is the
recording: call ``i`` answers with the tokens the real model sampled at the harness's call ``i``. Commands the
loop parses are executed for real, so observations come from the same (deterministic) task repository. At every
turn the prompt the rebuilt loop would send is compared token for token with the prompt the harness sent:

- **divergence rate**: share of the harness's turns whose prompt the rebuilt loop does not reproduce exactly
  (a turn the rebuilt loop never reaches, because it stopped earlier, counts as divergent);
- **first divergent turn** per rollout, with a short decoded excerpt of both sides at the first differing token;
- **rebuilt prefix drift**: share of the rebuilt loop's prompts that differ from a fresh render + tokenize of
  its own messages (what a messages-based server would have built; token-in/token-out keeps sampled ids).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from repro.protocols import command_env
from repro.rl.rebuilt.mini_swe_agent import Completion, LoopExit, LoopSpec, RebuiltLoop

EXCERPT_CHARS = 80


@dataclass
class TurnCheck:
    """One harness turn: did the rebuilt loop send the same prompt ids?"""

    turn: int
    harness_tokens: int
    rebuilt_tokens: int | None  # None: the rebuilt loop never made this call
    identical: bool
    first_diff: int | None = None  # token index of the first difference
    harness_excerpt: str = ""
    rebuilt_excerpt: str = ""
    rebuilt_drift: bool | None = None  # its own ids differ from re-rendering its messages


@dataclass
class RolloutFidelity:
    rollout_id: str
    harness_version: str
    rebuilt_exit: str
    turns: list[TurnCheck] = field(default_factory=list)

    @property
    def first_divergent_turn(self) -> int | None:
        return next((t.turn for t in self.turns if not t.identical), None)


class ReplayModel:
    """The recorded completions, in order; remembers each prompt the loop sent and its drift at that moment."""

    def __init__(self, calls: list[Any], tokenizer: Any) -> None:
        self.calls, self.tokenizer = calls, tokenizer
        self.prompts: list[list[int]] = []
        self.drift: list[bool] = []
        self.loop: RebuiltLoop | None = None

    def complete(self, prompt_ids: list[int]) -> Completion:
        turn = len(self.prompts)
        self.prompts.append(list(prompt_ids))
        if self.loop is not None and self.loop.conversation is not None:
            self.drift.append(self.loop.conversation.rendered_ids() != list(prompt_ids))
        if turn >= len(self.calls):
            raise LoopExit("ReplayEnded")
        call = self.calls[turn]
        ids = list(call.completion_ids or [])
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(list(prompt_ids), ids, text, call.finish_reason or "stop")


def replay_rollout(calls: list[Any], task_text: str, spec: LoopSpec, tokenizer: Any, workdir: Any,
                   rollout_id: str = "", harness_version: str = "") -> RolloutFidelity:
    """Replay one recorded rollout (its calls in ``seq`` order) in ``workdir`` (a fresh copy of its task)."""
    model = ReplayModel(calls, tokenizer)
    loop = RebuiltLoop(spec, tokenizer, model, workdir)
    model.loop = loop
    try:
        exit_status = loop.run(task_text)
    except ValueError as exc:  # e.g. a chat template that re-renders earlier turns: the loop cannot go on
        exit_status = f"{type(exc).__name__}: {exc}"[:120]
    result = RolloutFidelity(rollout_id, harness_version, exit_status)
    for turn, call in enumerate(calls):
        harness = list(call.prompt_ids or [])
        rebuilt = model.prompts[turn] if turn < len(model.prompts) else None
        check = compare(turn, harness, rebuilt, tokenizer)
        check.rebuilt_drift = model.drift[turn] if turn < len(model.drift) else None
        result.turns.append(check)
    return result


def replay_recorded(store: Any, rollouts: list[Any], tasks: dict[str, Any], box: Any, spec: LoopSpec,
                    tokenizer: Any, purpose: str | None = None) -> list[RolloutFidelity]:
    """:func:`replay_rollout` for each of ``rollouts`` (store records) in a fresh working copy of its task (a sandbox
    workspace, removed after); ``purpose``: replay only the calls of that purpose (all calls when None)."""
    results = []
    for rollout in rollouts:
        task = tasks[rollout.task_id]
        calls = [c for c in store.calls(rollout.rollout_id) if purpose is None or c.purpose == purpose]
        workspace = box.workspace(task, f"replay-{rollout.rollout_id}")
        try:
            local = replace(spec, command_env=spec.command_env | command_env(workspace))  # as the harness ran it
            results.append(replay_rollout(calls, task.problem_statement, local, tokenizer, workspace.path,
                                          rollout.rollout_id, rollout.harness_version))
        finally:
            workspace.cleanup()
    return results


def compare(turn: int, harness: list[int], rebuilt: list[int] | None, tokenizer: Any) -> TurnCheck:
    """Token-for-token comparison with an excerpt around the first difference."""
    if rebuilt is None:
        return TurnCheck(turn, len(harness), None, False, harness_excerpt="(the rebuilt loop stopped before)")
    if harness == rebuilt:
        return TurnCheck(turn, len(harness), len(rebuilt), True)
    first = next((i for i, (a, b) in enumerate(zip(harness, rebuilt, strict=False)) if a != b),
                 min(len(harness), len(rebuilt)))
    return TurnCheck(turn, len(harness), len(rebuilt), False, first, _excerpt(harness, first, tokenizer),
                     _excerpt(rebuilt, first, tokenizer))


def _excerpt(ids: list[int], at: int, tokenizer: Any) -> str:
    """The decoded text a little before and after token ``at`` (``⟦`` marks where the difference starts)."""
    before = tokenizer.decode(ids[max(0, at - 24):at], skip_special_tokens=False)[-EXCERPT_CHARS // 2:]
    after = tokenizer.decode(ids[at:at + 24], skip_special_tokens=False)[:EXCERPT_CHARS // 2]
    return f"{before}⟦{after}"


def summarize(results: list[RolloutFidelity]) -> dict[str, Any]:
    """Divergence rate over turns, first divergent turns, rebuilt drift rate, and the first excerpt."""
    turns = [t for r in results for t in r.turns]
    divergent = [t for t in turns if not t.identical]
    drift = [t.rebuilt_drift for t in turns if t.rebuilt_drift is not None]
    firsts = [r.first_divergent_turn for r in results if r.first_divergent_turn is not None]
    example = next((asdict(t) | {"rollout_id": r.rollout_id} for r in results for t in r.turns if not t.identical),
                   None)
    return {
        "rollouts": len(results), "turns": len(turns), "divergent_turns": len(divergent),
        "divergence_rate": len(divergent) / len(turns) if turns else None,
        "rollouts_diverged": len(firsts), "first_divergent_turn_min": min(firsts) if firsts else None,
        "first_divergent_turns": sorted(set(firsts)),
        "rebuilt_drift_rate": sum(drift) / len(drift) if drift else None,
        "rebuilt_exits": _counts(r.rebuilt_exit for r in results), "example": example,
    }


def _counts(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out

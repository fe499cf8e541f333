"""`repro inspect RUN`: the summary by phase, mode and outcome, and the --phase / --outcome / --limit filters, on
a run laid out as the miniature lays it out (demos, eval_before, rl/step_NNN in the run's store; an arm folder
with its own store and eval_after)."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.evaluation.reports import NOT_GRADED_REASON, InstanceReport, write_report
from repro.report.inspect import inspect_path
from repro.report.rollout_index import index_run, select
from repro.report.run_view import Selection
from repro.store import CallRecord, GroupCommitWriter, RolloutRecord, TraceStoreConfig, open_store

# (folder, store folder, mode, rollout id, verdict, harness status, calls); verdict None: no report
ROLLOUTS = [
    ("demos", ".", "demo", "demo-0", "not-graded", "finished", 2),
    ("demos", ".", "demo", "demo-1", "not-graded", "finished", 2),
    ("demos", ".", "demo", "demo-2", "not-graded", "finished", 2),
    ("eval_before", ".", "eval", "before-0", "resolved", "finished", 1),
    ("eval_before", ".", "eval", "before-1", "unresolved", "finished", 3),
    ("eval_before", ".", "eval", "before-2", "unresolved", "crashed", 0),  # an infra failure, not unresolved
    ("rl/step_000", ".", "train", "rl0-0", "resolved", "finished", 1),
    ("rl/step_000", ".", "train", "rl0-1", "unresolved", "finished", 2),
    ("rl/step_001", ".", "train", "rl1-0", "resolved", "finished", 1),
    ("rl/step_001", ".", "train", "rl1-1", "error", "finished", 1),
    ("proxy/eval_after", "proxy", "eval", "after-0", "resolved", "finished", 1),
    ("proxy/eval_after", "proxy", "eval", "after-1", "resolved", "finished", 2),
    (None, "proxy", "train", "lost-0", None, "", 1),  # registered and called, never graded
]


def _build_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    for i, (folder, store_dir, mode, rid, verdict, harness, calls) in enumerate(ROLLOUTS):
        config = TraceStoreConfig(path=str(run / store_dir / "traces.sqlite"))
        store = open_store(config.path)
        store.create_rollout(RolloutRecord(rid, task_id=f"task-{rid}", mode=mode, created_at=1000.0 + i))
        store.close()
        writer = GroupCommitWriter(config)
        for seq in range(calls):
            writer.write_sync(CallRecord(rid, seq, "chat", "ok", prompt_tokens=100, completion_tokens=10))
        writer.close()
        if folder is None:
            continue
        outcome = "unresolved" if verdict == "not-graded" else verdict
        reason = NOT_GRADED_REASON if verdict == "not-graded" else ""
        write_report(run / folder, InstanceReport(f"task-{rid}", 0, rid, outcome, reason=reason,
                                                  harness_status=harness, started_at=1000.0 + i), "")
    return run


def test_summary_counts_by_phase_mode_and_outcome(tmp_path: Path) -> None:
    entries = index_run(_build_run(tmp_path))
    counts: dict[tuple[str, str, str], list[int]] = {}
    for e in entries:
        row = counts.setdefault((e.phase, e.mode, e.outcome), [0, 0, 0])
        row[0], row[1], row[2] = row[0] + 1, row[1] + e.calls, row[2] + e.prompt_tokens + e.completion_tokens
    assert counts == {
        ("demos", "demo", "not-graded"): [3, 6, 660],
        ("eval_before", "eval", "resolved"): [1, 1, 110],
        ("eval_before", "eval", "unresolved"): [1, 3, 330],
        ("eval_before", "eval", "infra-failure"): [1, 0, 0],  # the crashed harness is kept apart from unresolved
        ("rl", "train", "resolved"): [2, 2, 220],  # both step folders fold into one phase
        ("rl", "train", "unresolved"): [1, 2, 220],
        ("rl", "train", "infra-failure"): [1, 1, 110],  # grader error
        ("proxy/eval_after", "eval", "resolved"): [2, 3, 330],  # the arm's own store
        ("proxy", "train", "no-report"): [1, 1, 110],
    }
    assert [e.phase for e in entries][:4] == ["demos"] * 3 + ["eval_before"]  # phases in the order they ran


def test_summary_is_printed_before_the_tables(tmp_path: Path, capsys) -> None:
    run = _build_run(tmp_path)
    inspect_path(run)
    out = capsys.readouterr().out
    assert "13 rollouts in 5 phases · resolved 5 · unresolved 2 · infra-failure 2 · not-graded 3 · no-report 1" in out
    summary = " ".join(out[out.index("summary by phase"):out.index("resolved (5)")].split())
    assert "│ rl │ train │ resolved │ 2 │ 2 │ 1.00 │ 200 │ 20 │" in summary
    assert "│ all │ │ │ 13 │ 19 │ 1.46 │ 1900 │ 190 │" in summary
    assert out.index("summary by phase") < out.index("resolved (5)") < out.index("not graded (demonstrations)")


@pytest.mark.parametrize(("phases", "outcomes", "expected"), [
    ((), (), [r[3] for r in ROLLOUTS]),
    (("rl",), (), ["rl0-0", "rl0-1", "rl1-0", "rl1-1"]),
    (("rl/step_001",), (), ["rl1-0", "rl1-1"]),
    (("eval_after",), (), ["after-0", "after-1"]),  # an arm's phase by its own name
    (("proxy",), (), ["after-0", "after-1", "lost-0"]),  # the arm: its reports and its store-only rollouts
    ((), ("infra-failure",), ["before-2", "rl1-1"]),
    (("eval_before,rl",), ("unresolved", "infra_failure"), ["before-1", "before-2", "rl0-1", "rl1-1"]),
    (("demos",), ("resolved",), []),
])
def test_filters_select_the_right_rollouts(tmp_path: Path, phases: tuple[str, ...], outcomes: tuple[str, ...],
                                          expected: list[str]) -> None:
    entries = index_run(_build_run(tmp_path))
    assert sorted(e.rollout_id for e in select(entries, phases, outcomes)) == sorted(expected)


def test_unknown_outcome_names_the_choices(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="unknown outcome failed: choose from resolved, unresolved"):
        select(index_run(_build_run(tmp_path)), (), ("failed",))


def test_limit_cuts_each_table_and_says_how_to_see_the_rest(tmp_path: Path, capsys) -> None:
    run = _build_run(tmp_path)
    inspect_path(run, selection=Selection(outcomes=("resolved", "not-graded"), limit=2))
    out = capsys.readouterr().out
    assert "selected (--outcome resolved --outcome not-graded): 8 of 13 rollouts" in out
    assert "… 3 more resolved not shown" in out and "--outcome resolved --limit 0" in out
    assert "… 1 more not-graded not shown" in out
    listed = out[out.index("resolved (5)"):]
    assert "before-0" in listed and "rl0-0" in listed and "rl1-0" not in listed  # the first two, in run order
    assert "before-1" not in listed and "lost-0" not in listed  # other outcomes are not listed
    inspect_path(run, selection=Selection(phases=("rl",), limit=0))
    out = capsys.readouterr().out
    assert "not shown" not in out and all(rid in out for rid in ("rl0-0", "rl0-1", "rl1-0", "rl1-1"))


def test_one_rollout_in_an_arm_store_and_an_instance_in_a_phase_folder(tmp_path: Path, capsys) -> None:
    run = _build_run(tmp_path)
    inspect_path(run, "after-1")  # a rollout of the arm's store: its calls come from there
    out = capsys.readouterr().out
    assert "calls of rollout after-1" in out and "verdict: resolved" in out
    inspect_path(run, "task-rl1-1")  # an instance id found in rl/step_001's reports
    assert "calls of rollout rl1-1" in capsys.readouterr().out


def test_the_command_line_passes_the_filters(tmp_path: Path, capsys) -> None:
    from repro.cli.commands import build_parser

    run = _build_run(tmp_path)
    args = build_parser().parse_args(["inspect", str(run), "--phase", "rl", "--outcome", "resolved,unresolved",
                                      "--limit", "1"])
    args.func(args)
    out = capsys.readouterr().out
    assert "selected (--phase rl --outcome resolved,unresolved): 3 of 13 rollouts" in out
    assert "… 1 more resolved not shown" in out and "rl0-1" in out and "before-0" not in out

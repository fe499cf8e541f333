"""The report's trajectory browser: a failed and a solved rollout of the same task side by side, turn by turn
(action, observation, then the grader's verdict and test output), and one rollout's page with its calls and how
they became training rows (call -> row -> token mask -> weight -> advantage), as `repro inspect RUN ROLLOUT`
prints them. Turns come from :mod:`repro.report.turns`, rows from :mod:`repro.train.samples`."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import groupby

from repro.evaluation.reports import PATCH_FILE
from repro.report.html import esc, pre, table, tag
from repro.report.run_data import FAILED, INFRA, SOLVED, UNGRADED, Sample
from repro.report.turns import Turn, clip, graded_tests, task_text, turns
from repro.store import CallRecord, RolloutRecord, open_store
from repro.train.samples import RolloutSamples, Row, SampleConfig, SampleSet, group_sample_set

CLIP = 1200  # characters of an action / observation shown before "… (N more characters)"


@dataclass
class TaskSamples:
    """All samples of one task across the report's runs."""

    instance_id: str
    samples: list[Sample]

    def of(self, category: str) -> list[Sample]:
        return [s for s in self.samples if s.category == category]

    def pair(self) -> tuple[Sample | None, Sample | None]:
        """(failed, solved): of all such pairs, one from the same run and phase when there is one."""
        failed, solved = self.of(FAILED), self.of(SOLVED)
        if not failed or not solved:
            return (failed or [None])[0], (solved or [None])[0]
        return min(((f, s) for f in failed for s in solved), key=lambda p: (p[0].run != p[1].run,
                                                                          p[0].phase != p[1].phase))

    def note(self) -> str | None:
        """What the page says when the task lacks a solved or a failed rollout."""
        failed, solved = self.pair()
        if failed and solved:
            return None
        missing = "no solved rollout" if failed else "no failed rollout" if solved else \
            "no graded rollout (only demonstrations or infrastructure failures)"
        return f"{missing} of this task in these runs."

    def counts(self) -> dict[str, int]:
        return {c: len(self.of(c)) for c in (SOLVED, FAILED, INFRA, UNGRADED)}


def by_task(samples: Sequence[Sample]) -> list[TaskSamples]:
    """Samples grouped per task: tasks with both a solved and a failed rollout first, then by id."""
    tasks: dict[str, list[Sample]] = {}
    for sample in samples:
        tasks.setdefault(sample.report.instance_id, []).append(sample)
    grouped = [TaskSamples(i, s) for i, s in tasks.items()]
    return sorted(grouped, key=lambda t: (t.note() is not None, not t.of(SOLVED), t.instance_id))


def file_stem(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)


@dataclass
class Loaded:
    """A sample with its store records (None when its store does not hold the rollout)."""

    sample: Sample
    rollout: RolloutRecord | None
    calls: list[CallRecord]


def load(sample: Sample) -> Loaded:
    if sample.store is None:
        return Loaded(sample, None, [])
    store = open_store(sample.store)
    try:
        rollout = store.get_rollout(sample.report.rollout_id)
        return Loaded(sample, rollout, store.calls(sample.report.rollout_id) if rollout else [])
    finally:
        store.close()


def outcome_span(sample: Sample) -> str:
    report = sample.report
    word = "not graded (demonstration)" if sample.category == UNGRADED else report.outcome
    return tag("span", esc(word), class_=f"outcome {sample.category}")


def shown(text: str) -> str:
    """``text`` clipped for a page; text that is only whitespace says so (a blank box reads as a rendering bug)."""
    if not text:
        return "(empty)"
    if not text.strip():
        return f"(only whitespace: {len(text)} characters)"
    return clip(text, CLIP)


def _turn_html(turn: Turn, number: int) -> str:
    tokens = f"{turn.prompt_tokens or 0}+{turn.completion_tokens or 0} tokens"
    head = tag("div", esc(f"turn {number} · call {turn.seq} · {turn.status} · finish {turn.finish_reason or '-'} · "
                          f"{tokens}"), class_="label")
    thought = pre(shown(turn.thought)) if turn.thought else ""
    seen = "(none: the rollout ended after this call)" if turn.observation is None else shown(turn.observation)
    return (head + thought + tag("div", "action", class_="label") + pre(shown(turn.action), "action")
            + tag("div", "observation", class_="label") + pre(seen))


def verdict_html(sample: Sample) -> str:
    """The grader's verdict: outcome and reason, each graded test's status, the grader's log tail, the patch."""
    report = sample.report
    parts = [tag("div", "verdict", class_="label"),
             tag("p", outcome_span(sample) + esc(f" {report.reason}" if report.reason else ""))]
    tests = graded_tests(report)
    if tests:
        parts.append(table([{"test": t, "kind": k, "status": tag("span", esc(s), class_="resolved" if s == "PASSED"
                                                                   else "unresolved")} for t, k, s in tests],
                           html_columns=("status",)))
    elif sample.category != UNGRADED:
        parts.append(tag("p", "(no test statuses recorded)", class_="muted"))
    if report.grade_log_tail:
        parts.append(tag("details", tag("summary", "test output (grader log, tail)") + pre(report.grade_log_tail)))
    patch = sample.folder / PATCH_FILE
    if patch.exists():
        text = patch.read_text(errors="replace")
        parts.append(tag("details", tag("summary", f"patch ({report.patch_bytes} bytes, +{report.patch_added}/"
                                                   f"-{report.patch_removed})") + pre(clip(text, 6000))))
    return "".join(parts)


def _head_html(loaded: Loaded, link: Callable[[Sample], str | None]) -> str:
    sample, report = loaded.sample, loaded.sample.report
    href = link(sample)
    rollout = tag("a", esc(report.rollout_id), href=href) if href else esc(report.rollout_id)
    word = {SOLVED: "solved", FAILED: "failed", INFRA: "infrastructure failure", UNGRADED: "demonstration"}
    harness = report.harness_status + (f" ({report.harness_exit_status})" if report.harness_exit_status else "")
    return (tag("div", esc(word[sample.category]), class_="label") + tag("div", outcome_span(sample) + " · " + rollout)
            + tag("div", esc(f"{sample.where} · {len(loaded.calls)} calls · harness {harness}"), class_="muted"))


def side_by_side(task: TaskSamples, link: Callable[[Sample], str | None]) -> str:
    """The task's failed rollout (left) and solved rollout (right), turn by turn, then both verdicts; a note where
    the task has no solved (or no failed) rollout."""
    failed, solved = task.pair()
    loaded = [load(s) if s else None for s in (failed, solved)]
    parts = [tag("h3", esc(f"task {task.instance_id}"))]
    note = task.note()
    if note:
        parts.append(tag("div", esc(note), class_="banner warn"))
    calls = next((x.calls for x in loaded if x and x.calls), [])
    if calls:
        parts.append(tag("details", tag("summary", "the task as the harness phrased it")
                         + pre(clip(task_text(calls), 3000))))
    columns = [turns(x.calls) if x else [] for x in loaded]
    cells = []
    for x, category in zip(loaded, (FAILED, SOLVED), strict=True):
        body = _head_html(x, link) if x else tag("div", esc(f"no {'failed' if category == FAILED else 'solved'} "
                                                           "rollout of this task"), class_="label")
        cells.append(tag("div", body, class_=f"cell head {category}" if x else "cell head empty"))
    for index in range(max((len(c) for c in columns), default=0)):
        for x, column in zip(loaded, columns, strict=True):
            if index < len(column):
                cells.append(tag("div", _turn_html(column[index], index + 1), class_="cell"))
            else:
                ended = "" if x is None else f"(no turn {index + 1}: this rollout ended after {len(column)})"
                cells.append(tag("div", esc(ended), class_="cell empty"))
    for x in loaded:
        cells.append(tag("div", verdict_html(x.sample), class_="cell") if x else tag("div", "", class_="cell empty"))
    parts.append(tag("div", "".join(cells), class_="pair", id_="pair-" + file_stem(task.instance_id)))
    return tag("section", "".join(parts), class_="task")


def _mask_html(row: Row) -> str:
    """The row's tokens as a strip: grey = context (mask 0, not trained), green = sampled (mask 1); each sampled
    run is one call's completion."""
    spans, seqs = [], iter(row.call_seqs)
    for value, run in groupby(row.loss_mask):
        n = len(list(run))
        what = f"call {next(seqs, '?')}: {n} sampled tokens (mask 1)" if value else f"{n} context tokens (mask 0)"
        spans.append(tag("span", "", class_=f"m{value}", style=f"flex-grow:{n}", title=what))
    return tag("div", "".join(spans), class_="mask")


def rows_html(info: RolloutSamples, group: SampleSet, config: SampleConfig) -> str:
    """The calls -> rows table of one rollout: calls merged, tokens, mask strip, weight and advantage."""
    valid = sum(1 for r in group.rollouts.values() if r.masked is None)
    reward = "-" if info.reward is None else f"{info.reward:g}"
    masked = f"MASKED ({info.masked})" if info.masked else "trained"
    parts = [tag("p", esc(f"{info.status}, reward {reward}, {masked} · mode {config.mode}, weighting "
                          f"{config.weighting}, scale {config.scale_rewards} · advantage within group {info.group_id}: "
                          f"{len(group.rollouts)} rollouts, {valid} valid · {info.n_calls} calls -> "
                          f"{len(info.rows)} rows"))]
    if info.rows:
        parts.append(tag("div", "token mask:" + tag("span", "", class_="m0", style="background:#d1d5db")
                         + "context (mask 0)" + tag("span", "", style="background:#22c55e") + "sampled (mask 1)",
                         class_="legend note"))
        parts.append(table([{"row": r.row_index, "call seqs": ", ".join(map(str, r.call_seqs)), "tokens": r.n_tokens,
                             "sampled (mask=1)": r.n_sampled, "masked out": r.n_tokens - r.n_sampled,
                             "token mask": _mask_html(r), "weight": f"{r.weight:.4f}",
                             "advantage": f"{r.advantage:+.4f}",
                             "logprobs": "ok" if r.logprobs_complete else "MISSING (NaN)"} for r in info.rows],
                           html_columns=("token mask",)))
    else:
        parts.append(tag("p", "no rows: no trainable call", class_="muted"))
    if info.skipped:
        skipped = "; ".join(f"seq {c.seq}: {c.reason}" for c in info.skipped)
        parts.append(tag("p", esc(f"skipped calls ({len(info.skipped)}): {skipped}"), class_="note"))
    return "".join(parts)


def calls_html(calls: list[CallRecord]) -> str:
    return table([{"seq": c.seq, "purpose": c.purpose, "status": c.status, "stream": "y" if c.streamed else "n",
                   "prompt ids": len(c.prompt_ids or []), "completion ids": len(c.completion_ids or []),
                   "finish": c.finish_reason or "-",
                   "extends prev": "-" if c.extends_previous is None else "yes" if c.extends_previous else "NO",
                   "retry": "-" if c.retry_count is None else c.retry_count,
                   "ms": "-" if c.t_end is None else f"{1000 * (c.t_end - c.t_start):.0f}"} for c in calls])


def rollout_body(sample: Sample, config: SampleConfig) -> str:
    """A rollout's page: header, task, turns, verdict, calls, and calls -> rows."""
    loaded = load(sample)
    report = sample.report
    ending = report.harness_exit_status or report.harness_reason
    parts = [tag("p", outcome_span(sample) + esc(f" · task {report.instance_id} · {sample.where} · harness "
                                                 f"{report.harness_status} ({ending}) · patch +{report.patch_added}/"
                                                 f"-{report.patch_removed}"))]
    if loaded.rollout is None:
        parts.append(tag("div", "this rollout is not in the run's trace store: no calls to show", class_="banner warn"))
        return "".join([*parts, verdict_html(sample)])
    if loaded.calls:
        parts.append(tag("details", tag("summary", "the task as the harness phrased it")
                         + pre(clip(task_text(loaded.calls), 3000))))
    parts.append(tag("h2", "turns"))
    parts += [tag("div", _turn_html(t, n), class_="cell") for n, t in enumerate(turns(loaded.calls), 1)]
    parts += [tag("h2", "verdict"), verdict_html(sample), tag("h2", "calls"), calls_html(loaded.calls),
              tag("h2", "calls -> rows (what the trainer gets)")]
    assert sample.store is not None  # the rollout was found in it
    store = open_store(sample.store)
    try:
        group = group_sample_set(store, report.rollout_id, config)
    finally:
        store.close()
    parts.append(rows_html(group.rollouts[report.rollout_id], group, config))
    return "".join(parts)

"""The console helpers of long runs: progress lines (a live bar in a terminal, a line every 10% when piped) and
expected phase durations from this machine's recorded rates."""

from __future__ import annotations

import io

from rich.console import Console

from repro.common import eta
from repro.common.progress import duration, progress


def test_progress_prints_plain_lines_when_piped() -> None:
    buffer = io.StringIO()
    with progress(20, "rollouts", Console(file=buffer, width=100)) as bar:
        for _ in range(20):
            bar.advance(note="resolved")
    lines = buffer.getvalue().splitlines()
    # every 10%, no float drift; elapsed and the time left at the rate so far, elapsed alone at the end
    assert [line.split(" (")[0] for line in lines] == [f"rollouts: {n}/20 resolved" for n in range(2, 21, 2)]
    assert all(line.endswith(" left)") for line in lines[:-1]) and lines[-1].endswith("(0s)")


def test_durations_read_as_a_person_writes_them() -> None:
    assert [duration(s) for s in (4.4, 65, 3725)] == ["4s", "1m 05s", "1h 02m"]


def test_progress_drives_a_live_bar_in_a_terminal() -> None:
    buffer = io.StringIO()
    with progress(3, "grading", Console(file=buffer, width=100, force_terminal=True)) as bar:
        for _ in range(3):
            bar.advance(note="ok")
    assert bar.done == 3 and "3/3" in buffer.getvalue()


def test_phase_estimates_come_from_this_machines_last_run(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path))
    assert eta.expected("eval_sample", 400).endswith("expected on the reference 2-core machine")
    assert eta.expected("unknown_kind", 400) == "no earlier run on this machine to estimate from"
    eta.record("eval_sample", 100, 100.0)
    eta.record("eval_sample", 0, 100.0)  # nothing measured: ignored
    eta.record("eval_sample", 4, 20.0)  # a toy run's 5 s per sample is mostly start-up: ignored
    assert eta.expected("eval_sample", 400) == "~6m 40s expected from this machine's last run"
    (tmp_path / "timings.json").write_text("not json")
    assert eta.expected("eval_sample", 400).endswith("on the reference 2-core machine")

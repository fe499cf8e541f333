"""fanout=ray: samples run whole (workspace -> real mini-SWE-agent through the proxy -> grade) on Ray actors, one
per sandbox host, while the driver registers, records and reports; a local Ray (ray.init()) stands in for a
cluster. Skipped where Ray is not installed (the `ray` extra; CI installs it with `dev`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from repro.cli.commands import main
from repro.evaluation import read_reports
from repro.store import open_store

pytest.importorskip("ray", reason="fanout=ray needs the ray extra (pip install -e '.[ray]')")


@pytest.mark.e2e
def test_an_evaluation_fans_its_samples_out_over_two_hosts(tmp_path: Path) -> None:
    main(["run", "experiment=eval_bundled", "fanout=ray", "fanout.hosts=2", "tasks.n_tasks=4", "eval.k=1",
          f"run.output_root={tmp_path}"])
    (run_dir,) = tmp_path.glob("eval_bundled/*")
    reports = read_reports(run_dir)
    assert len(reports) == 4 and not any(r.infra_failure for r in reports)
    hosts = {r.host for r in reports}
    assert len(hosts) == 2 and all(h and not h.endswith(f":{os.getpid()}") for h in hosts)  # two actors, not us
    store = open_store(run_dir / "traces.sqlite")
    try:
        for report in reports:  # every call went through the proxy under its rollout, and was graded here
            assert report.n_calls == len(store.calls(report.rollout_id)) > 0
            assert store.get_rollout(report.rollout_id).status == "finished"
    finally:
        store.close()


def test_fanout_is_refused_where_the_job_runs_samples_itself(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="runs its samples in this process only") as refused:
        main(["run", "experiment=smoke", "fanout=ray", f"run.output_root={tmp_path}"])
    assert "tokenizer_drift" in str(refused.value) and "harness_sweep" in str(refused.value)  # found, not listed

"""The data pipeline end to end at toy size (real harness, CPU server, proxy, local sandbox): the counts chain from
stage to stage, and the files it writes load back as tasks."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pytest

from repro.cli.commands import main
from repro.tasks.loaders import load_tasks


@pytest.mark.e2e
def test_the_job_writes_counts_and_task_files_at_toy_size(tmp_path: Path) -> None:
    main(["run", "experiment=data_pipeline", "tasks.n_tasks=4", "pipeline.val_tasks=1", "pipeline.probe.k=2",
          f"run.output_root={tmp_path}"])
    (counts_path,) = tmp_path.glob("data_pipeline/*/counts.json")
    counts = json.loads(counts_path.read_text())
    chain = [s["count"] for s in counts["stages"]]
    assert chain[0] == 4 and all(a >= b for a, b in pairwise(chain[:6]))
    assert chain[-2] + chain[-1] == chain[-3] == counts["classes"]["kept"]
    assert sum(counts["classes"][c] for c in ("mixed", "all_fail", "all_pass")) == chain[4]
    for name, count in (("train.jsonl", chain[-2]), ("val.jsonl", chain[-1])):
        path = counts_path.parent / name
        assert path.exists() and len(load_tasks(str(path)) if count else []) == count

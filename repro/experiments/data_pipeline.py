"""The data pipeline behind Agent Lightning's "~6,000 training samples", as steps of repro
(``repro run experiment=data_pipeline``):

1. load the rows (SWE-smith, or any task source);
2. drop rows with an empty problem statement, rows whose starting point is missing (a SWE-smith instance branch
   or image, a bundled task's repository or commit), and rows with more than ``max_tests`` graded tests;
3. probe each remaining task ``probe.k`` times with a served model in the real harness (mode ``probe``, recorded,
   never trained on);
4. keep the mixed-outcome tasks plus a share of all-fail ones (:func:`repro.train.task_filter.select_tasks`);
5. split the kept tasks into train and validation files by a seeded draw.

The count after every stage is printed and written to ``counts.json``; the kept rows go to ``train.jsonl`` and
``val.jsonl`` (the rows as loaded, so SWE-smith rows keep their schema's meaning in ``extra``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.recipe.setup import Setup, eval_model
from repro.rl.evaluator import EvalConfig
from repro.rl.task_probe import run_probes
from repro.sandbox.repos import RepoError
from repro.serving.stack import EndpointServingConfig
from repro.tasks.distributions import TaskDistributionConfig
from repro.tasks.loaders import write_tasks
from repro.tasks.schema import Task
from repro.tasks.sets import TaskFileConfig, load_task_set
from repro.train.task_filter import TaskFilterConfig, pass_at_k_curve, select_tasks


@dataclass
class DataPipelineConfig:
    """The pipeline's own settings (the probe's sampling comes from ``eval``)."""

    max_tests: int = 200  # rows with more FAIL_TO_PASS + PASS_TO_PASS tests are dropped
    probe: TaskFilterConfig = field(default_factory=lambda: TaskFilterConfig(enabled=True, pool=0, k=4))
    val_tasks: int = 400  # kept tasks drawn into val.jsonl (the rest: train.jsonl)
    seed: int = 0


def missing_start(box: Any, task: Task) -> str | None:
    """Why the task's starting point cannot be had (None when it can): the sandbox resolves it as a rollout would."""
    try:
        if getattr(box, "gives_containers", False):
            workspace = box.open_container(task, "pipeline-check")  # runs a SWE-smith row's branch checkout
            workspace.cleanup()
        else:
            box.resolver.resolve(task)
    except (RepoError, OSError, RuntimeError) as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None


def static_filters(tasks: list[Task], max_tests: int, missing: Any) -> tuple[list[Task], list[tuple[str, int]]]:
    """Tasks left after each drop, in order, and ``(stage, count after it)`` for each."""
    stages = [("loaded", len(tasks))]
    tasks = [t for t in tasks if t.problem_statement.strip()]
    stages.append(("non-empty problem statement", len(tasks)))
    tasks = [t for t in tasks if missing(t) is None]
    stages.append(("starting point present", len(tasks)))
    tasks = [t for t in tasks if len(t.FAIL_TO_PASS) + len(t.PASS_TO_PASS) <= max_tests]
    stages.append((f"<= {max_tests} graded tests", len(tasks)))
    return tasks, stages


def split_kept(kept: list[Task], val_tasks: int, seed: int) -> tuple[list[Task], list[Task]]:
    """(train, val): ``val_tasks`` of the kept tasks by a seeded hash draw, each list in kept order."""
    def draw(task: Task) -> str:
        return hashlib.sha256(f"split:{seed}:{task.instance_id}".encode()).hexdigest()

    val_ids = {t.instance_id for t in sorted(kept, key=draw)[:max(0, val_tasks)]}
    return [t for t in kept if t.instance_id not in val_ids], [t for t in kept if t.instance_id in val_ids]


def data_pipeline_job(setup: Setup, tasks: TaskDistributionConfig | TaskFileConfig, eval: EvalConfig,
                      pipeline: DataPipelineConfig, run_dir: Path) -> dict[str, Any]:
    """Run the five stages; returns (and writes) the counts."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # swebench's import turns on INFO logging globally
    run_dir = Path(run_dir)
    name, rows = load_task_set(tasks)
    with setup.harness_and_sandbox() as (agent, box):
        candidates, stages = static_filters(rows, pipeline.max_tests, lambda t: missing_start(box, t))
        for stage, count in stages:
            print(f"data pipeline: {count:>7} {stage}", flush=True)
        endpoint = isinstance(setup.serving, EndpointServingConfig)
        model_dir = Path() if endpoint else eval_model(setup.model, eval, rows)[0]
        sampling = {"temperature": eval.temperature, "top_p": eval.top_p, "max_tokens": eval.max_tokens}
        with setup.server(model_dir, run_dir) as stack:
            probes = run_probes(run_dir / "probe", run_dir / "traces.sqlite", candidates, pipeline.probe,
                                sampling, stack, agent, box)
    outcomes = {i: o for i, o in probes["outcomes"].items() if len(o) >= 2}
    result = select_tasks(outcomes, pipeline.probe.all_fail_share, pipeline.seed)
    by_id = {t.instance_id: t for t in candidates}
    train, val = split_kept([by_id[i] for i in result.kept], pipeline.val_tasks, pipeline.seed)
    classes = result.counts()
    stages += [(f"probed (>= 2 of k={pipeline.probe.k} rollouts without an infrastructure failure)", len(outcomes)),
               (f"kept: {classes['mixed']} mixed + {classes['kept_all_fail']} all-fail "
                f"(of {classes['all_fail']}; {classes['all_pass']} all-pass dropped)", classes["kept"]),
               ("train.jsonl", len(train)), ("val.jsonl", len(val))]
    for stage, count in stages[-4:]:
        print(f"data pipeline: {count:>7} {stage}", flush=True)
    write_tasks(train, run_dir / "train.jsonl")
    write_tasks(val, run_dir / "val.jsonl")
    counts = {"source": name, "stages": [{"stage": s, "count": c} for s, c in stages], "classes": classes,
              "probe_infra_failures": probes["infra_failures"], "pass_at_k": pass_at_k_curve(outcomes),
              "probe_k": pipeline.probe.k, "seed": pipeline.seed}
    (run_dir / "counts.json").write_text(json.dumps(counts, indent=2) + "\n")
    return counts

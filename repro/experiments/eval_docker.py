"""``experiment=eval_docker``: one checkpoint, the same held-out tasks, evaluated under ``sandbox=local`` and
``sandbox=docker`` in one run (one model server and proxy, the real mini-SWE-agent), plus the container's own
cost per rollout measured side by side: start, one command, teardown (docker) vs working copy, one command,
removal (local).

Both arms use one frozen spec apart from the sandbox (so their fingerprints differ only there) and the same
per-(task, sample) seeds, so their per-task pass rates pair up; the table gives docker - local with a paired
interval. Task images are built first if missing (cached by content hash; the build time is reported).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.evaluation import eval_metrics, write_metrics
from repro.evaluation.paired import paired_summary
from repro.recipe.setup import Setup, eval_model
from repro.report.eval_docker_table import run_markdown
from repro.rl.evaluator import EvalConfig, Evaluator, build_spec
from repro.sandbox.docker import DockerSandbox, DockerSandboxConfig
from repro.sandbox.local import LocalSandbox
from repro.sandbox.select import make_sandbox
from repro.tasks.distributions import TaskDistributionConfig
from repro.tasks.schema import Task
from repro.tasks.sets import TaskFileConfig, load_task_set

ARMS = ("local", "docker")


@dataclass
class OverheadConfig:
    """The side-by-side measurement of a container's own cost: on the first ``tasks`` held-out tasks, one workspace
    each, ``commands`` runs of ``true`` in it."""

    tasks: int = 20
    commands: int = 5


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    pick = (lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]) if ordered else (lambda q: 0.0)
    return {"n": len(ordered), "median_s": statistics.median(ordered) if ordered else 0.0, "p90_s": pick(0.9),
            "mean_s": statistics.fmean(ordered) if ordered else 0.0}


def _timed(fn: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started


def container_costs(docker: DockerSandbox, local: LocalSandbox, tasks: list[Task], commands: int) -> dict[str, Any]:
    """Per rollout, measured here: make the workspace, run ``true`` ``commands`` times, remove it."""
    times: dict[str, dict[str, list[float]]] = {arm: {"start": [], "command": [], "teardown": []} for arm in ARMS}
    for i, task in enumerate(tasks):
        workspace, seconds = _timed(lambda t=task, i=i: docker.open_container(t, f"overhead-{i}"))
        times["docker"]["start"].append(seconds)
        for _ in range(commands):
            times["docker"]["command"].append(_timed(lambda w=workspace: w.run("true"))[1])
        times["docker"]["teardown"].append(_timed(workspace.cleanup)[1])
        copy, seconds = _timed(lambda t=task, i=i: local.workspace(t, f"overhead-{i}"))
        times["local"]["start"].append(seconds)
        for _ in range(commands):
            times["local"]["command"].append(_timed(lambda c=copy: local.run(c, "true", 30))[1])
        times["local"]["teardown"].append(_timed(copy.cleanup)[1])
    return {arm: {step: _quantiles(values) for step, values in steps.items()} for arm, steps in times.items()}


def _rollout_times(reports: list[Any]) -> dict[str, Any]:
    return {"harness": _quantiles([r.harness_duration_s for r in reports]),
            "grade": _quantiles([r.grade_duration_s for r in reports])}


def _per_task(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics["per_task"].items() if v is not None}


def eval_docker_job(setup: Setup, tasks: TaskDistributionConfig | TaskFileConfig, docker: DockerSandboxConfig,
                    eval: EvalConfig, run_dir: Path, overhead: OverheadConfig | None = None) -> dict[str, Any]:
    """Evaluate one checkpoint under both sandboxes in one run (the local arm in ``setup.sandbox``, the docker arm in
    ``docker``); metrics.json holds both arms and the costs."""
    from repro.sandbox.docker_engine import client
    from repro.sandbox.images import build_task_images

    logging.getLogger("httpx").setLevel(logging.WARNING)  # swebench's import turns on INFO logging globally
    run_dir, started, overhead = Path(run_dir), time.time(), overhead or OverheadConfig()
    local = setup.sandbox
    name, task_list = load_task_set(tasks)
    build = build_task_images(client(), task_list, LocalSandbox(local).resolver)
    arms: dict[str, Any] = {}
    with setup.harness_and_sandbox() as (agent, local_box):
        model_dir, model_name = eval_model(setup.model, eval, task_list)
        with setup.server(model_dir, run_dir) as stack:
            for arm, config in (("local", local), ("docker", docker)):
                spec = build_spec(agent, name, task_list, config, eval,
                                  getattr(tasks, "seed", None), setup.served_model_name)
                # the local arm runs in the setup's sandbox, the docker arm in its own, closed after it
                sandbox = contextlib.nullcontext(local_box) if arm == "local" else contextlib.closing(
                    make_sandbox(config))
                phase_started = time.time()
                with sandbox as box:
                    evaluator = Evaluator(stack, agent, box, eval, spec=spec, store_path=run_dir / "traces.sqlite")
                    reports = evaluator.evaluate(task_list, run_dir / arm, model_name).reports
                arms[arm] = eval_metrics(reports, spec, eval.experiment, model_name, started_at=phase_started,
                                         durations_s={"evaluation": time.time() - phase_started})
                arms[arm]["rollout_times"] = _rollout_times(reports)
    local_box, docker_box = LocalSandbox(local), DockerSandbox(docker)
    try:
        costs = container_costs(docker_box, local_box, task_list[:overhead.tasks], overhead.commands)
    finally:
        docker_box.close()
        local_box.close()
    metrics = {"kind": "eval_docker", "experiment": eval.experiment, "table": eval.experiment, "model": model_name,
               "task_distribution": name, "k": eval.k, "temperature": eval.temperature, "arms": arms,
               "docker_minus_local": paired_summary(_per_task(arms["local"]), _per_task(arms["docker"])),
               "container_costs": costs, "images": {k: v for k, v in build.items() if k != "images"},
               "docker_limits": dataclasses.asdict(docker.limits), "started_at": started,
               "wall_s": time.time() - started, "run_dir": str(run_dir)}
    write_metrics(run_dir, metrics)
    print(f"# {metrics['table']}\n\n{run_markdown([metrics])}", flush=True)
    return metrics

"""The evaluation experiment (``eval_bundled``, ``swebench_verified``, ``harness_sweep``): a frozen evaluation of one
model (:class:`~repro.rl.evaluator.Evaluator`) -> metrics.json and the printed table. Resumable: finished samples of
the run directory are skipped (``run.dir=<existing run>``)."""

from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Any

from repro.evaluation import Cost, eval_metrics, write_metrics
from repro.recipe.setup import Setup, eval_model
from repro.report.eval_table import run_markdown
from repro.rl.evaluator import EvalConfig, Evaluator, build_spec, refuse_if_all_infra
from repro.serving.stack import EndpointServingConfig
from repro.tasks.distributions import TaskDistributionConfig
from repro.tasks.sets import TaskFileConfig, load_task_set


def _cpu_seconds() -> float:
    """CPU of this process and every child it has reaped (servers, harness workers, graders)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def evaluate_job(setup: Setup, tasks: TaskDistributionConfig | TaskFileConfig, eval: EvalConfig,
                 run_dir: Path) -> dict[str, Any]:
    """Evaluate the model under a frozen spec in the real harness; writes the run records and prints the table."""
    run_dir, started, cpu0 = Path(run_dir), time.time(), _cpu_seconds()
    name, task_list = load_task_set(tasks)
    with setup.harness_and_sandbox() as (agent, box):
        spec = build_spec(agent, name, task_list, setup.sandbox, eval, getattr(tasks, "seed", None),
                          setup.served_model_name)
        model_dir, model_name = (Path(), setup.served_model_name) \
            if isinstance(setup.serving, EndpointServingConfig) else eval_model(setup.model, eval, task_list)
        with setup.server(model_dir, run_dir) as stack:
            evaluator = Evaluator(stack, agent, box, eval, spec=spec, store_path=run_dir / "traces.sqlite")
            reports = evaluator.evaluate(task_list, run_dir, model_name).reports
    cost = Cost(cpu_h={"evaluation": (_cpu_seconds() - cpu0) / 3600})
    metrics = eval_metrics(reports, spec, eval.experiment, model_name, cost=cost, started_at=started,
                           durations_s={"evaluation": time.time() - started},
                           extra={"samples_run_now": evaluator.ran})
    metrics["run_dir"], metrics["layout"] = str(run_dir), eval.layout
    write_metrics(run_dir, metrics)
    print(run_markdown(metrics), flush=True)
    refuse_if_all_infra(reports, run_dir)
    return metrics

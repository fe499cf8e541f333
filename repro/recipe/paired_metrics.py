"""The record of a before/after run (``metrics.json`` of kind ``before_after``), written by the miniature
(``mini_repro``) and by RL on a given checkpoint (``rl_run``, ``agl_swebench_qwen35_9b``): both frozen evaluations
under one spec, the paired tests between them, the RL run in between with its per-step diagnostics, the weights'
sha256 and the compute per phase. ``repro table`` turns runs of this kind into ``results/<experiment>.md``."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from repro.evaluation import eval_metrics
from repro.evaluation.paired import mcnemar_exact, paired_summary
from repro.evaluation.spec import EvalSpec
from repro.rl.config import RLConfig
from repro.rl.evaluator import EvalConfig


def per_instance(reports: list[Any]) -> dict[str, float]:
    """Each instance's share of resolved samples, every sample as graded: an infrastructure failure counts by its
    grade (unsolved when there was nothing to grade; a harness that crashed after its patch passed, e.g. mini 1.x's
    EOF at the step-limit prompt, counts as solved). Pass@1 instead leaves infrastructure failures out of its
    denominator, so the two differ by those samples."""
    outcomes: dict[str, list[float]] = {}
    for r in reports:
        outcomes.setdefault(r.instance_id, []).append(float(r.outcome == "resolved"))
    return {k: sum(v) / len(v) for k, v in outcomes.items()}


def paired_tests(before: list[Any], after: list[Any]) -> dict[str, Any]:
    """Paired tests over instances: bootstrap interval, sign-flip test and minimum detectable effect (alpha 0.05,
    power 0.8) on per-instance means over the k samples; exact McNemar on sample 0 (the binary test; with k > 1
    it ignores the other samples)."""
    a = {r.instance_id: r.outcome == "resolved" for r in before if r.sample == 0}
    b = {r.instance_id: r.outcome == "resolved" for r in after if r.sample == 0}
    mc = mcnemar_exact(a, b)
    return {"only_before": mc.only_a, "only_after": mc.only_b, "mcnemar_p": mc.p_value,
            **paired_summary(per_instance(before), per_instance(after))}


@dataclass
class BeforeAfter:
    """What a before/after run measured. ``labels``: the model names of the two evaluations; ``weights``: their
    weights' sha256; ``start``: the starting checkpoint's record (the warm start's, or the given checkpoint's);
    ``extra``: what only some runs have (``habits``, ``validation``, ``platform``), in the record's order."""

    ev: EvalConfig
    spec: EvalSpec
    run_dir: Path
    train_name: str
    before: list[Any]
    after: list[Any]
    labels: tuple[str, str]
    weights: tuple[str, str]
    start: dict[str, Any]
    rl: RLConfig
    history: list[dict[str, Any]]
    probe: dict[str, Any] | None
    loop: str
    compute: dict[str, Any]
    started: float
    extra: dict[str, Any] = field(default_factory=dict)


def before_after_metrics(r: BeforeAfter) -> dict[str, Any]:
    """The ``before_after`` metrics.json of a run."""
    ev, spec, extra = r.ev, r.spec, r.extra
    return {
        "kind": "before_after", "experiment": ev.experiment, "table": ev.experiment, "run_dir": str(r.run_dir),
        "fingerprint": spec.fingerprint(), "eval_temperature": ev.temperature,
        "task_distribution": spec.tasks.name, "train_tasks": r.train_name,
        "before": eval_metrics(r.before, spec, ev.experiment, r.labels[0]),
        "after": eval_metrics(r.after, spec, ev.experiment, r.labels[1]),
        "paired": paired_tests(r.before, r.after),
        **({"habits": extra["habits"]} if "habits" in extra else {}),
        "per_instance": {"before": per_instance(r.before), "after": per_instance(r.after)},
        "weights_sha256": {"before": r.weights[0], "after": r.weights[1]},
        "warm_start": r.start, "rl": {"config": r.rl.schedule(), "history": r.history},
        "probe": r.probe, "diagnostics": [h["diagnostics"] for h in r.history],
        **({"validation": extra["validation"]} if "validation" in extra else {}),
        "trainer": asdict(r.rl.update), "samples": {"mode": r.rl.samples.mode, "weighting": r.rl.update.weighting},
        "loop": r.loop, "seed": r.rl.seed,
        **({"platform": extra["platform"]} if "platform" in extra else {}),
        "compute": r.compute, "started_at": r.started, "finished_at": time.time(), "wall_s": time.time() - r.started,
    }

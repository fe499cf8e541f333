"""``experiment=harness_matrix``: train in each harness (and in the rebuilt loop), evaluate in each.

One warm start that acts in every harness of the matrix (a tokenizer with every harness's fixed texts, the expert's
demonstrations through each: :mod:`repro.recipe.warm_start_mix`), evaluated in each harness; then one RL arm
per training loop (``matrix.train_in``: a harness behind the proxy; ``matrix.rebuilt_of``: the trainer-owned rebuild
of that harness's loop), each from that warm start on the same tasks, seeds and budget, and every trained policy
evaluated in every harness under that harness's frozen spec. ``metrics.json`` has kind ``harness_matrix``;
``repro table`` publishes ``results/<experiment>.md`` (trained in x evaluated in, pooled over seeds).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from repro.common.accounting import Accountant
from repro.common.configs import split_table_name
from repro.common.files import weights_sha256
from repro.common.tracking import tracked
from repro.evaluation import eval_metrics, write_metrics
from repro.evaluation.habits import slip_share
from repro.recipe.loop_fidelity import FidelityConfig, comparison_metrics, replay_store
from repro.recipe.matrix import REBUILT, Matrix, MatrixConfig, prepared_matrix
from repro.recipe.miniature import MiniatureConfig
from repro.recipe.paired_metrics import paired_tests, per_instance
from repro.rl.checkpoints import stage_policy
from repro.rl.config import RLConfig
from repro.rl.loop import RLLoop
from repro.rl.rebuilt.harness import LoopConfig, rl_harness

LOOP_SLICE = "loop_comparison"  # the folder of the proxy-vs-rebuilt slice of a matrix run


def train_arm(matrix: Matrix, arm: tuple[str, str, str], rl: RLConfig) -> dict[str, Any]:
    """RL from the warm start in the arm's loop, then the trained policy evaluated in every harness."""
    name, trained_in, kind = arm
    mini, started, acct = matrix.minis[trained_in], time.time(), Accountant()
    arm_dir = matrix.run_dir / f"arm_{name}"
    policy = stage_policy(mini.warm_dir, arm_dir)
    print(f"phase rl ({name}: {kind} loop of {trained_in}): {rl.steps} steps x {rl.tasks_per_step} tasks x "
          f"{rl.samples_per_task} samples", flush=True)
    with mini.cfg.setup.server(policy, arm_dir) as stack:
        with rl_harness(LoopConfig(kind), mini.agent, policy) as agent, \
                tracked(matrix.run_dir, mini.cfg.setup.tracking, f"rl-{name}") as tracker:
            trainer = RLLoop(stack, agent, mini.box, rl, arm_dir, tracker=tracker, accountant=acct,
                                grades=mini.grades, probe_harness=mini.agent)
            history = [s.record for s in trainer.fit(mini.rl_tasks)]
        with acct.phase("eval_after"):
            after = matrix.evaluate_all(stack, arm_dir / "eval", f"rl-{name}")
    return {"trained_in": trained_in, "loop": kind, "dir": arm_dir, "after": after, "history": history,
            "probe": trainer.probe,
            "weights_sha256": weights_sha256(policy), "compute": acct.to_dict(), "wall_s": time.time() - started}


def harness_matrix_job(miniature: MiniatureConfig, matrix: MatrixConfig, rl: RLConfig, run_dir: Path,
                       fidelity: FidelityConfig | None = None, loop: Any = None) -> dict[str, Any]:
    """The warm start evaluated in every harness, one RL arm per training loop, each evaluated in every harness,
    each proxy arm's training rollouts replayed through the rebuilt loop; returns (and writes) the metrics (kind
    ``harness_matrix``) and, with a rebuilt arm, the proxy-vs-rebuilt slice as its own ``loop_comparison`` record
    (``<run>/loop_comparison``). ``loop`` is mini_repro's single-arm setting, inherited by the config and unused:
    ``matrix`` names the arms."""
    run_dir, started, fidelity = Path(run_dir), time.time(), fidelity or FidelityConfig(other_versions=[])
    with prepared_matrix(miniature, matrix, run_dir) as prepared:
        mini = prepared.any
        print(f"phase eval_before: the warm start in {len(prepared.minis)} harnesses x {len(mini.test_list)} tasks",
              flush=True)
        with mini.cfg.setup.server(mini.warm_dir, run_dir) as stack, prepared.acct.phase("eval_before"):
            warm = prepared.evaluate_all(stack, run_dir / "eval_before", mini.warm_label)
        arms = {arm[0]: train_arm(prepared, arm, rl) for arm in matrix.arms}
        print("phase fidelity: each proxy arm's training rollouts replayed through the rebuilt loop", flush=True)
        with prepared.acct.phase("fidelity"):
            fid = matrix_fidelity(prepared, matrix, arms, fidelity)
    metrics = matrix_metrics(prepared, warm, arms, rl, started) | {"fidelity": fid}
    write_metrics(run_dir, metrics)
    loop_slice = proxy_vs_rebuilt(prepared, matrix, warm, arms, fid, rl, started)
    if loop_slice is not None:
        write_slice(run_dir, loop_slice)
    return metrics


def matrix_fidelity(prepared: Matrix, matrix: MatrixConfig, arms: dict[str, dict[str, Any]],
                    cfg: FidelityConfig) -> dict[str, Any]:
    """Per proxy arm: its training rollouts replayed turn by turn through the rebuilt loop of ``rebuilt_of`` (how
    far that loop is from the harness the arm trained in); empty without a rebuilt arm."""
    if not matrix.rebuilt_of:
        return {}
    mini = prepared.minis[matrix.rebuilt_of]
    tasks = {t.instance_id: t for t in [*mini.test_list, *mini.rl_tasks]}
    return {name: replay_store(arm["dir"] / "traces.sqlite", tasks, mini.cfg.setup.harness, mini.warm_dir,
                               mini.box, cfg, mode="train") | {"trained_in": arm["trained_in"]}
            for name, arm in arms.items() if arm["loop"] == "proxy"}


def proxy_vs_rebuilt(prepared: Matrix, matrix: MatrixConfig, warm: dict[str, list[Any]],
                     arms: dict[str, dict[str, Any]], fid: dict[str, Any], rl: RLConfig,
                     started: float) -> dict[str, Any] | None:
    """The proxy arm of ``rebuilt_of`` and the rebuilt arm, both evaluated in that harness, as a
    ``loop_comparison`` record (fidelity keyed by harness version, as that table reads it); None without both."""
    home = matrix.rebuilt_of
    if not home or not matrix.loop_table or home not in arms or REBUILT not in arms:
        return None
    mini = prepared.minis[home]
    pair = {"proxy": home, REBUILT: REBUILT}
    slice_arms = {kind: arms[name] | {"after": arms[name]["after"][home]} for kind, name in pair.items()}
    by_version = {prepared.minis[f["trained_in"]].spec.harness.version: f for f in fid.values()}
    metrics = comparison_metrics(mini, warm[home], slice_arms, by_version, rl, started)
    table = split_table_name(matrix.loop_table, mini.cfg.tasks.split)  # a validation run's slice: its own table
    return metrics | {"experiment": table, "table": table, "slice_of": str(prepared.run_dir)}


def write_slice(run_dir: Path, metrics: dict[str, Any]) -> Path:
    """``<run>/loop_comparison/metrics.json``, with the run's overrides and config beside it (a record of its own
    for ``repro table``)."""
    slice_dir = run_dir / LOOP_SLICE
    slice_dir.mkdir(parents=True, exist_ok=True)
    for name in ("overrides.txt", "config.yaml"):
        if (run_dir / name).is_file():
            shutil.copyfile(run_dir / name, slice_dir / name)
    return write_metrics(slice_dir, metrics)


def matrix_metrics(prepared: Matrix, warm: dict[str, list[Any]], arms: dict[str, dict[str, Any]], rl: RLConfig,
                   started: float) -> dict[str, Any]:
    """The ``harness_matrix`` record: every harness's spec, the warm start's and each arm's evaluations in every
    harness, the paired tests against the warm start, each arm's RL history."""
    mini, ev = prepared.any, prepared.any.cfg.eval
    specs = {name: m.spec for name, m in prepared.minis.items()}

    def evaluated(reports: dict[str, list[Any]], label: str) -> dict[str, Any]:
        return {h: eval_metrics(r, specs[h], ev.experiment, label) for h, r in reports.items()}

    out_arms = {name: {
        "trained_in": a["trained_in"], "loop": a["loop"], "after": evaluated(a["after"], f"rl-{name}"),
        "paired_vs_warm": {h: paired_tests(warm[h], r) for h, r in a["after"].items()},
        "per_instance": {h: per_instance(r) for h, r in a["after"].items()},
        "habits": {h: slip_share(a["dir"] / "traces.sqlite", r, mini.operators) for h, r in a["after"].items()},
        "history": a["history"], "diagnostics": [s["diagnostics"] for s in a["history"]], "probe": a["probe"],
        "weights_sha256": a["weights_sha256"], "compute": a["compute"], "wall_s": a["wall_s"]}
        for name, a in arms.items()}
    return {
        "kind": "harness_matrix", "experiment": ev.experiment, "table": ev.experiment,
        "run_dir": str(prepared.run_dir), "fingerprints": {h: s.fingerprint() for h, s in specs.items()},
        "harnesses": {h: s.harness.name + "@" + s.harness.version for h, s in specs.items()},
        "task_distribution": mini.spec.tasks.name, "train_tasks": mini.train_name, "eval_temperature": ev.temperature,
        "warm_start": mini.warm, "warm": evaluated(warm, mini.warm_label),
        "warm_per_instance": {h: per_instance(r) for h, r in warm.items()}, "arms": out_arms,
        "warm_habits": {h: slip_share(prepared.run_dir / "traces.sqlite", r, mini.operators) for h, r in warm.items()},
        "rl": rl.schedule(), "trainer": asdict(rl.update), "seed": rl.seed, "compute": prepared.acct.to_dict(),
        "started_at": started, "finished_at": time.time(), "wall_s": time.time() - started,
    }

"""``repro plan``: the schedule read from a composed experiment, GPU-hours per phase from measured throughputs
(checked by hand), and the printed estimate naming every assumption."""

from __future__ import annotations

import pytest

from repro.cli.commands import main
from repro.cli.plan import RolloutShape, Schedule, Throughput, estimate, schedule_of
from repro.cli.runner import compose_config


def test_the_schedule_is_what_the_experiment_runs() -> None:
    cfg = compose_config(["experiment=mini_repro", "rl.steps=10", "rl.tasks_per_step=4", "rl.samples_per_task=8",
                          "eval.k=2", "tasks.n_tasks=50"])
    assert schedule_of(cfg) == Schedule(rl_rollouts=10 * 4 * 8, updates_per_batch=2, rl_steps=10,
                                        validation_rollouts=0, test_rollouts=2 * 50 * 2)


def test_ppo_mini_batches_train_each_row_at_most_once() -> None:
    """The recipe's mini-batches (128 rows, at most 2 a step): 16 x 8 = 128 rollouts are one pass, not two; 100
    rollouts are fewer than a mini-batch (the step is skipped); 300 keep 256 of their rows."""
    cfg = compose_config(["experiment=agl_swebench_qwen35_9b", "rl.steps=10"])
    assert cfg.trainer.ppo_mini_batch_rows == 128 and cfg.trainer.max_ppo_updates == 2
    assert schedule_of(cfg, test_tasks=500).updates_per_batch == 1.0
    for per_step, passes in ((100, 0.0), (128, 1.0), (300, 256 / 300), (1000, 256 / 1000)):
        cfg = compose_config(["experiment=agl_swebench_qwen35_9b", "rl.tasks_per_step=1",
                              f"rl.samples_per_task={per_step}"])
        assert schedule_of(cfg, test_tasks=500).updates_per_batch == pytest.approx(passes)


def test_gpu_hours_follow_from_tokens_and_throughputs() -> None:
    schedule = Schedule(rl_rollouts=1000, updates_per_batch=2, rl_steps=10, validation_rollouts=100,
                        test_rollouts=400)
    plan = estimate(schedule, RolloutShape(sampled_tokens=3600, context_tokens=36_000),
                    Throughput("h100", generation_tokens_per_s=1000, training_tokens_per_s=20_000,
                               price_per_gpu_hour=2.0), gpus=4)
    assert plan.generation_gpu_h == pytest.approx(1000 * 3600 / 1000 / 3600)  # 1.0
    assert plan.training_gpu_h == pytest.approx(1000 * 36_000 * 2 / 20_000 / 3600)  # 1.0
    assert plan.evaluation_gpu_h == pytest.approx(500 * 3600 / 1000 / 3600)  # 0.5
    assert plan.wall_h == pytest.approx(2.5 / 4) and plan.cost == pytest.approx(5.0)
    with pytest.raises(ValueError):
        estimate(schedule, RolloutShape(1, 1), Throughput("x", 0, 1), 1)


def test_the_command_prints_the_estimate_and_its_assumptions(capsys) -> None:
    main(["plan", "experiment=mini_repro", "--gpu-type", "H200", "--gpus", "8", "--generation-tokens-per-s", "2500",
          "--training-tokens-per-s", "30000", "--sampled-tokens-per-rollout", "4000",
          "--context-tokens-per-rollout", "40000", "--price-per-gpu-hour", "3.5"])
    out = capsys.readouterr().out
    assert "# Plan: mini_repro on 8 x H200" in out and "| **total** |" in out and "Cost:" in out
    for assumption in ("rl_rollouts: 384",  # the default: 6 steps x 8 tasks x 8 samples
                       "sampled_tokens: 4000.0", "training_tokens_per_s: 30000.0", "prefix-cached"):
        assert assumption in out, assumption

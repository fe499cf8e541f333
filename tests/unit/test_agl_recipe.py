"""experiment=agl_swebench_qwen35_9b composes to Agent Lightning's published SWE recipe, and its schedule (4 epochs
capped at 1,000 steps) resolves against the size of the training file."""

from __future__ import annotations

import pytest
from hydra.utils import instantiate

from repro.cli.runner import compose_config
from repro.rl.config import RLConfig

RECIPE = ["experiment=agl_swebench_qwen35_9b", "eval.checkpoint=/models/Qwen3.5-9B",
          "train_tasks.source=train.jsonl", "val_tasks.source=val.jsonl"]


@pytest.fixture(scope="module")
def cfg():
    return compose_config(RECIPE)


def test_the_recipe_values(cfg) -> None:
    assert (cfg.rl.samples_per_task, cfg.rl.tasks_per_step, cfg.rl.epochs, cfg.rl.steps) == (8, 16, 4, 1000)
    assert (cfg.rl.temperature, cfg.rl.max_tokens) == (1.0, 12288)
    assert cfg.rl.extra_sampling.chat_template_kwargs.enable_thinking is False
    assert (cfg.trainer.learning_rate, cfg.trainer.clip_low, cfg.trainer.clip_high) == (1e-6, 0.2, 0.28)
    assert (cfg.trainer.updates_per_batch, cfg.trainer.weighting, cfg.samples.mode) == (2, "rollout", "prefix_merge")
    assert (cfg.harness.step_limit, cfg.harness.wall_time_limit_s, cfg.harness.max_tokens) == (100, 5400, 12288)
    assert cfg.serving.max_model_len == 81920 and cfg.serving._target_.endswith("VllmServingConfig")
    assert cfg.sandbox._target_.endswith("DockerSandboxConfig")
    reward = cfg.rl.reward
    assert (reward.tests, reward.turn_penalty, reward.turn_penalty_from) == ("same_file", 0.1, 80)
    assert (reward.prompt_penalty, reward.prompt_penalty_from, reward.prompt_penalty_to) == (0.1, 50000, 64000)
    assert (cfg.validation.every_steps, cfg.validation.n_tasks, cfg.validation.temperature) == (16, 400, 0.7)
    assert cfg.tasks.source == "princeton-nlp/SWE-bench_Verified"


def test_agent_lightnings_update_rule_rows_and_schedule(cfg) -> None:
    trainer = cfg.trainer
    assert (trainer.ppo_mini_batch_rows, trainer.max_ppo_updates, trainer.old_logprobs) == (128, 2, "recompute")
    assert (trainer.clip_ratio_c, trainer.weight_decay, list(trainer.adam_betas)) == (3.0, 0.01, [0.9, 0.999])
    samples = cfg.samples
    assert (samples.std_ddof, samples.eps, samples.failed_reward) == (1, 1e-6, 0.0)
    assert (samples.max_prompt_tokens, samples.max_response_tokens) == (65536, 65536)
    assert (cfg.sandbox.test_timeout_s, cfg.sandbox.command_timeout_s, cfg.harness.command_timeout_s) == (600, 120, 120)
    assert cfg.sandbox.scrub_history is True
    assert cfg.rl.reshuffle_each_epoch is True and cfg.validation.before_first_step is True


def test_the_configs_instantiate(cfg) -> None:
    rl = instantiate(cfg.rl, _convert_="all")
    assert rl.reward.shaped and rl.checkpoint_every == 16
    trainer = instantiate(cfg.trainer, _convert_="all")
    assert trainer.device == "cuda" and trainer.bf16 and trainer.gradient_checkpointing
    samples = instantiate(cfg.samples, _convert_="all")
    assert samples.std_ddof == 1 and samples.max_prompt_tokens == 65536


@pytest.mark.parametrize(("n_tasks", "steps"), [(6000, 1000), (2000, 500), (10, 3)])
def test_four_epochs_capped_at_1000_steps(n_tasks: int, steps: int) -> None:
    rl = RLConfig(steps=1000, epochs=4, tasks_per_step=16)
    assert rl.with_steps_for(n_tasks).steps == steps
    assert RLConfig(steps=12).with_steps_for(n_tasks).steps == 12  # no epochs: the steps as given

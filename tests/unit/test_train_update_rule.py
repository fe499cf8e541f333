"""The update rule as Agent Lightning runs it (repro.train.rl with repro.train.batching): optimizer steps per
PPO mini-batch, old logprobs recorded or recomputed by the trainer, the recorded-vs-trainer mismatch, dual clip."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from repro.rl.steps import step_diagnostics
from repro.train.config import UpdateConfig
from repro.train.objective import OffPolicyError, clipped_policy_loss, pad_rows, token_logprobs
from repro.train.rl import PolicyTrainer
from tests.support import FakeRow

SHIFT = 0.05  # nats added to every recorded sampling logprob


def on_policy_rows(model_dir: Path, n: int, shift: float = 0.0) -> list[FakeRow]:
    """``n`` rows (alternating advantage signs) whose recorded logprobs are the checkpoint's own, plus ``shift``."""
    model = PolicyTrainer(model_dir, UpdateConfig()).model
    rows = []
    for i in range(n):
        row = FakeRow(list(range(5 + i, 21 + i)), [0] * 8 + [1] * 8, advantage=1.0 if i % 2 == 0 else -1.0)
        batch = pad_rows([FakeRow(row.input_ids, row.loss_mask, [0.0] * 16)], 0)
        with torch.no_grad():
            logps = token_logprobs(model, batch["input_ids"], batch["attention_mask"])[0]
        row.old_logprobs = [float(x) + shift if m else 0.0 for x, m in zip(logps, row.loss_mask, strict=True)]
        rows.append(row)
    return rows


def count_steps(trainer: PolicyTrainer) -> list[int]:
    """A counter of the trainer's optimizer steps."""
    calls, step = [0], trainer.optimizer.step

    def counting(*args: object, **kwargs: object) -> object:
        calls[0] += 1
        return step(*args, **kwargs)

    trainer.optimizer.step = counting
    return calls


@pytest.mark.parametrize(("n_rows", "steps"), [(1, 0), (2, 1), (3, 1), (4, 2), (7, 2)])
def test_one_optimizer_step_per_mini_batch_capped(tiny_model_dir: Path, n_rows: int, steps: int) -> None:
    trainer = PolicyTrainer(tiny_model_dir, UpdateConfig(ppo_mini_batch_rows=2, max_ppo_updates=2))
    calls = count_steps(trainer)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    stats = trainer.update(on_policy_rows(tiny_model_dir, n_rows))
    assert calls[0] == steps == stats["optimizer_steps"] == len(stats["updates"])
    assert stats["update_skipped"] == (steps == 0) and stats["rows_planned"] == 2 * steps
    moved = any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))
    assert moved == (steps > 0)


def test_the_planned_normalizer_counts_zero_advantage_rows_and_their_mini_batch_still_steps(
        tiny_model_dir: Path) -> None:
    rows = on_policy_rows(tiny_model_dir, 4)
    rows[2].advantage = rows[3].advantage = 0.0  # the second mini-batch has nothing to learn from
    trainer = PolicyTrainer(tiny_model_dir, UpdateConfig(ppo_mini_batch_rows=2, max_ppo_updates=2))
    calls = count_steps(trainer)
    stats = trainer.update(rows)
    assert stats["normalizer"] == 4.0 and stats["rows_trained"] == 2 and calls[0] == 2


def test_by_default_every_row_gets_updates_per_batch_passes(tiny_model_dir: Path) -> None:
    trainer = PolicyTrainer(tiny_model_dir, UpdateConfig(updates_per_batch=3))
    calls = count_steps(trainer)
    stats = trainer.update(on_policy_rows(tiny_model_dir, 3))
    assert trainer.plan([]) is None and calls[0] == 3 == stats["optimizer_steps"] and not stats["update_skipped"]
    with pytest.raises(ValueError, match="ppo_mini_batch_rows > 0"):
        other = PolicyTrainer(tiny_model_dir, UpdateConfig(ppo_mini_batch_rows=1))
        trainer.update([], trainer.plan([]) or other.plan([]))


@pytest.mark.parametrize("mini_batch_rows", [0, 2])
def test_recompute_makes_the_first_ratio_exactly_one_despite_perturbed_recorded_logprobs(
        tiny_model_dir: Path, mini_batch_rows: int) -> None:
    rows = on_policy_rows(tiny_model_dir, 4, shift=SHIFT)
    cfg = UpdateConfig(old_logprobs="recompute", on_policy_log_ratio_max=0.0, learning_rate=1e-7,
                   ppo_mini_batch_rows=mini_batch_rows)
    stats = PolicyTrainer(tiny_model_dir, cfg).update(rows)
    first, second = stats["updates"]
    assert first["ratio_mean"] == 1.0 and first["clip_fraction"] == 0.0 and first["log_ratio_abs_max"] == 0.0
    assert second["log_ratio_abs_max"] < 1e-3  # against the trainer's logprobs, not the recorded ones (off by 0.05)
    mismatch = stats["old_logprob_mismatch"]
    assert mismatch["max"] == pytest.approx(SHIFT, abs=1e-5) and mismatch["mean"] == pytest.approx(SHIFT, abs=1e-5)
    assert mismatch["tokens"] == 4 * 8  # every trained row measured before the first optimizer step


@pytest.mark.parametrize("mini_batch_rows", [0, 2])
def test_recorded_logprobs_show_the_perturbation_as_the_ratio(tiny_model_dir: Path, mini_batch_rows: int) -> None:
    rows = on_policy_rows(tiny_model_dir, 4, shift=SHIFT)
    cfg = UpdateConfig(on_policy_log_ratio_max=0.0, learning_rate=1e-7, ppo_mini_batch_rows=mini_batch_rows)
    stats = PolicyTrainer(tiny_model_dir, cfg).update(rows)
    first, second = stats["updates"]
    assert first["ratio_mean"] == pytest.approx(math.exp(-SHIFT), abs=1e-4)
    assert second["log_ratio_abs_max"] == pytest.approx(SHIFT, abs=1e-3)
    assert stats["old_logprob_mismatch"]["max"] == pytest.approx(SHIFT, abs=1e-5)
    assert stats["old_logprob_mismatch"]["mean"] == pytest.approx(SHIFT, abs=1e-5)


@pytest.mark.parametrize("old_logprobs", ["recorded", "recompute"])
def test_the_on_policy_check_reads_the_recorded_mismatch_in_both_modes(tiny_model_dir: Path,
                                                                      old_logprobs: str) -> None:
    rows = on_policy_rows(tiny_model_dir, 2, shift=SHIFT)
    with pytest.raises(OffPolicyError, match="on_policy_log_ratio_max"):
        PolicyTrainer(tiny_model_dir, UpdateConfig(old_logprobs=old_logprobs)).update(rows)


def test_a_skipped_step_still_measures_the_mismatch(tiny_model_dir: Path) -> None:
    rows = on_policy_rows(tiny_model_dir, 1, shift=SHIFT)
    stats = PolicyTrainer(tiny_model_dir, UpdateConfig(ppo_mini_batch_rows=2, on_policy_log_ratio_max=0.0)).update(rows)
    assert stats["update_skipped"] and stats["updates"] == []
    assert stats["old_logprob_mismatch"]["max"] == pytest.approx(SHIFT, abs=1e-5)
    diagnostics = step_diagnostics({"step": 0, "reward_mean": 0.0, "mixed_groups": 0, "groups": 1, "calls": 1,
                                    "rollouts": 1, "infra_failures": 0, "rollout_s": 1.0, "update": stats})
    assert diagnostics["update_skipped"] is True and diagnostics["optimizer_steps"] == 0
    assert diagnostics["old_logprob_mismatch_max"] == pytest.approx(SHIFT, abs=1e-5)
    assert diagnostics["old_logprob_mismatch_mean"] == pytest.approx(SHIFT, abs=1e-5)


def test_dual_clip_caps_a_negative_advantages_loss_at_c_times_its_size() -> None:
    # tokens: (A=-1, ratio 5), (A=+1, ratio 5), (A=-2, ratio 1.1); one token a row, weights 1, normalizer 1
    logps = torch.tensor([[0.0, math.log(5.0)], [0.0, math.log(5.0)], [0.0, math.log(1.1)]], requires_grad=True)
    old = torch.zeros(3, 2)
    adv, mask, weights = torch.tensor([-1.0, 1.0, -2.0]), torch.tensor([[0, 1]] * 3), torch.ones(3)
    plain, _ = clipped_policy_loss(logps, old, adv, mask, weights, 1.0)
    assert float(plain.detach()) == pytest.approx(5.0 - 1.28 + 2.2)  # -A*r = 5; -A*clip(r) = -1.28; 2 * 1.1
    dual, stats = clipped_policy_loss(logps, old, adv, mask, weights, 1.0, clip_ratio_c=3.0)
    assert float(dual.detach()) == pytest.approx(3.0 - 1.28 + 2.2)  # the first token capped at -A * c = 3
    assert stats["dual_clip_fraction"] == pytest.approx(1 / 3)
    dual.backward()
    assert logps.grad[0, 1] == 0.0  # a capped token gives no gradient; one inside both clips does
    assert logps.grad[2, 1] == pytest.approx(2.2)


def test_bad_update_rule_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        UpdateConfig(clip_ratio_c=0.5)
    with pytest.raises(ValueError, match="old_logprobs must be one of"):
        UpdateConfig(old_logprobs="server")
    with pytest.raises(ValueError, match="max_ppo_updates must be >= 0"):
        UpdateConfig(ppo_mini_batch_rows=-1)

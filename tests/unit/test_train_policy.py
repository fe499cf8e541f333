"""The policy-gradient update: direction, masks, weights, clipping, and refusing unusable rows."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from repro.train.config import UpdateConfig
from repro.train.objective import OffPolicyError, check_rows, clipped_policy_loss, pad_rows, token_logprobs
from repro.train.rl import PolicyTrainer
from tests.support import FakeRow


def _rows_with_logprobs(model_dir: Path, rows: list[FakeRow]) -> list[FakeRow]:
    """Fill old_logprobs with the checkpoint's own logprobs (what the server would have recorded)."""
    trainer = PolicyTrainer(model_dir, UpdateConfig())
    for row in rows:
        batch = pad_rows([FakeRow(row.input_ids, row.loss_mask, [0.0] * len(row.input_ids))], 0)
        with torch.no_grad():
            logps = token_logprobs(trainer.model, batch["input_ids"], batch["attention_mask"])[0]
        row.old_logprobs = [float(x) if m else 0.0 for x, m in zip(logps, row.loss_mask, strict=True)]
    return rows


def _sampled_logprob(trainer: PolicyTrainer, row: FakeRow) -> float:
    batch = pad_rows([row], trainer.pad_id)
    with torch.no_grad():
        logps = token_logprobs(trainer.model, batch["input_ids"], batch["attention_mask"])[0]
    return float(sum(lp for lp, m in zip(logps, row.loss_mask, strict=True) if m))


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_update_moves_sampled_tokens_in_the_direction_of_the_advantage(tiny_model_dir: Path, advantage: float) -> None:
    row = _rows_with_logprobs(tiny_model_dir, [FakeRow(list(range(5, 25)), [0] * 12 + [1] * 8)])[0]
    row.advantage = advantage
    trainer = PolicyTrainer(tiny_model_dir, UpdateConfig(learning_rate=1e-2, updates_per_batch=1))
    before = _sampled_logprob(trainer, row)
    stats = trainer.update([row])
    after = _sampled_logprob(trainer, row)
    assert stats["rows_trained"] == 1 and stats["updates"][0]["log_ratio_abs_max"] < 1e-4
    assert (after - before) * advantage > 0


def test_zero_advantage_rows_are_skipped_but_count_in_the_normalizer(tiny_model_dir: Path) -> None:
    rows = _rows_with_logprobs(tiny_model_dir, [FakeRow(list(range(5, 15)), [0] * 5 + [1] * 5),
                                                FakeRow(list(range(6, 16)), [0] * 5 + [1] * 5)])
    rows[1].advantage = 0.0
    stats = PolicyTrainer(tiny_model_dir, UpdateConfig()).update(rows)
    assert stats["rows_trained"] == 1 and stats["normalizer"] == 2.0


def _loss(weights: list[float], advantages: list[float], old_shift: float = 0.0, mask_first: int = 3):
    torch.manual_seed(0)
    logps = torch.randn(2, 6, requires_grad=True)
    mask = torch.tensor([[0] * mask_first + [1] * (6 - mask_first)] * 2)
    old = logps.detach().clone()
    old[:, :mask_first] += old_shift  # only unsampled positions change
    loss, stats = clipped_policy_loss(logps, old, torch.tensor(advantages), mask, torch.tensor(weights),
                                      normalizer=sum(weights))
    loss.backward()
    return loss, logps.grad, stats


def test_unsampled_tokens_never_touch_the_loss_or_the_gradient() -> None:
    loss_a, grad_a, _ = _loss([1.0, 1.0], [1.0, -0.5])
    loss_b, grad_b, _ = _loss([1.0, 1.0], [1.0, -0.5], old_shift=5.0)
    assert torch.equal(loss_a, loss_b) and torch.equal(grad_a, grad_b)
    assert torch.all(grad_a[:, :3] == 0) and torch.all(grad_a[:, 3:] != 0)


def test_row_weights_scale_each_rows_gradient() -> None:
    _, grad_equal, _ = _loss([1.0, 1.0], [1.0, 1.0])
    _, grad_skewed, _ = _loss([3.0, 1.0], [1.0, 1.0])
    # normalizer 2 -> 4: row 0 goes from 1/2 to 3/4 of the loss, row 1 from 1/2 to 1/4
    assert torch.allclose(grad_skewed[0], grad_equal[0] * 1.5) and torch.allclose(grad_skewed[1], grad_equal[1] * 0.5)


def test_ratio_outside_the_clip_range_gives_no_gradient() -> None:
    logps = torch.zeros(1, 4, requires_grad=True)
    old = torch.full((1, 4), -1.0)  # ratio e = 2.72 > 1.28
    loss, stats = clipped_policy_loss(logps, old, torch.tensor([1.0]), torch.ones(1, 4), torch.tensor([1.0]), 1.0)
    loss.backward()
    assert torch.all(logps.grad == 0) and stats["clip_fraction"] == 1.0
    assert math.isclose(float(loss), -1.28, rel_tol=1e-6)


def test_rows_without_recorded_logprobs_are_refused() -> None:
    with pytest.raises(ValueError, match="logprobs"):
        check_rows([FakeRow([1, 2, 3], [0, 1, 1], [0.0, float("nan"), -1.0])])
    with pytest.raises(ValueError, match="length"):
        check_rows([FakeRow([1, 2, 3], [0, 1], [0.0, -1.0])])


def test_saved_policy_is_a_servable_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = PolicyTrainer(tiny_model_dir, UpdateConfig()).save(tmp_path / "policy")
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    assert not (tmp_path / "policy.tmp").exists()


def test_bad_trainer_settings_name_the_choices() -> None:
    with pytest.raises(ValueError, match="rollout"):
        UpdateConfig(weighting="episode")


def test_first_update_refuses_logprobs_the_policy_did_not_produce(tiny_model_dir: Path) -> None:
    rows = _rows_with_logprobs(tiny_model_dir, [FakeRow(list(range(5, 25)), [0] * 12 + [1] * 8),
                                                FakeRow(list(range(7, 27)), [0] * 10 + [1] * 10, advantage=-1.0)])
    stats = PolicyTrainer(tiny_model_dir, UpdateConfig()).update(rows)  # the server's own logprobs: on policy
    first = stats["updates"][0]
    assert first["log_ratio_abs_max"] < 1e-4 and first["entropy"] > 0 and "entropy" not in stats["updates"][1]
    rows = _rows_with_logprobs(tiny_model_dir, rows)
    rows[1].old_logprobs[15] += 0.01  # one sampled token's recorded logprob off by 0.01 nats
    trainer = PolicyTrainer(tiny_model_dir, UpdateConfig())
    with pytest.raises(OffPolicyError, match="on_policy_log_ratio_max"):
        trainer.update(rows)
    assert PolicyTrainer(tiny_model_dir, UpdateConfig(on_policy_log_ratio_max=0.0)).update(rows)["rows_trained"] == 2


@pytest.mark.parametrize("field_name", ["temperature", "top_p"])
def test_rl_refuses_sampling_the_loss_does_not_model(field_name: str) -> None:
    from repro.rl.config import RLConfig

    with pytest.raises(ValueError, match=f"rl.{field_name}=0.7 is not supported"):
        RLConfig(**{field_name: 0.7})


def test_a_batch_without_advantage_is_still_checked_and_measured(tiny_model_dir: Path) -> None:
    rows = _rows_with_logprobs(tiny_model_dir, [FakeRow(list(range(5, 25)), [0] * 12 + [1] * 8, advantage=0.0)])
    stats = PolicyTrainer(tiny_model_dir, UpdateConfig()).update(rows)
    assert stats["updates"] == [] and stats["measured"]["log_ratio_abs_max"] < 1e-4 and stats["measured"]["entropy"] > 0
    rows[0].old_logprobs[14] -= 0.01
    with pytest.raises(OffPolicyError):
        PolicyTrainer(tiny_model_dir, UpdateConfig()).update(rows)

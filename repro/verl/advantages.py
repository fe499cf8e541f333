"""verl's GRPO advantage at the rollout level, as Agent Lightning's run computes it
(``enable_rollout_level_advantage``): one entry per rollout (its reward, its group as verl's ``uid``) through verl's
own ``compute_grpo_outcome_advantage``, shared by every row of the rollout. Computed per row instead, a rollout whose
prefix breaks made three rows would count three times in its group's mean and std."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from repro.verl.batch import RowLike


def rollout_advantages(rows: Sequence[RowLike], epsilon: float = 1e-6) -> dict[str, float]:
    """Rollout id -> verl's GRPO advantage (scaled by the group's sample std, ``epsilon`` in the denominator)."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    rollouts: dict[str, tuple[str, float]] = {}
    for row in rows:
        rollouts.setdefault(row.rollout_id, (row.group_id, float(row.reward or 0.0)))
    ids = list(rollouts)
    rewards = torch.tensor([[rollouts[r][1]] for r in ids], dtype=torch.float32)
    groups = np.array([rollouts[r][0] for r in ids], dtype=object)
    advantages, _ = compute_grpo_outcome_advantage(rewards, torch.ones_like(rewards), groups, epsilon=epsilon,
                                                   norm_adv_by_std_in_grpo=True)
    return {rid: float(advantages[i, 0]) for i, rid in enumerate(ids)}

"""Training: supervised warm start (trl's SFTTrainer) and the policy-gradient update on proxy-recorded rows."""

from repro.train.config import SftConfig, UpdateConfig
from repro.train.rl import clipped_policy_loss

__all__ = ["SftConfig", "UpdateConfig", "clipped_policy_loss"]

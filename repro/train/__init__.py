"""Training: supervised warm start (trl's SFTTrainer) and the policy-gradient update on proxy-recorded rows."""

from repro.train.config import RlConfig, SftConfig
from repro.train.rl import clipped_policy_loss

__all__ = ["RlConfig", "SftConfig", "clipped_policy_loss"]

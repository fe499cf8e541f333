"""The trainer's settings (one dataclass per phase; Hydra groups mirror them one to one)."""

from __future__ import annotations

from dataclasses import dataclass

from repro.train.device import DeviceSettings

WEIGHTINGS = ("rollout", "fragment")


@dataclass
class SftConfig(DeviceSettings):
    """Supervised warm start on demonstration rows (loss on sampled tokens only), run with trl's SFTTrainer.

    The schedule is warm-up, constant, then linear decay to ``min_lr_ratio`` (transformers' WSD schedule).
    Device, precision, gradient checkpointing and LoRA: :class:`~repro.train.device.DeviceSettings`.
    """

    epochs: float = 4.0
    batch_size: int = 16
    learning_rate: float = 3e-3
    warmup_steps: int = 30
    decay_fraction: float = 0.3
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0
    logging_steps: int = 50
    torch_threads: int = 0  # 0 = torch's default (one per core)
    sampling: str = "random"  # batch order: random | group_by_length (rows of similar length share a batch)


@dataclass
class RlConfig(DeviceSettings):
    """The policy-gradient update (GRPO/DAPO-style clipped objective, no KL term).

    ``weighting``: how a rollout's rows count — ``rollout`` (its rows share one rollout's weight) or
    ``fragment`` (each row counts as its own episode). ``updates_per_batch``: optimizer steps on the same
    rollouts (importance ratios against the recorded sampling logprobs keep later ones on-policy enough).
    ``on_policy_log_ratio_max``: the first update of every batch must see the policy that sampled it, so its
    max |log ratio| between the trainer's and the recorded logprobs above this fails the run (0: no check).
    Device, precision, gradient checkpointing, LoRA and FSDP: :class:`~repro.train.device.DeviceSettings`.
    """

    weighting: str = "rollout"
    learning_rate: float = 2e-4
    clip_low: float = 0.2
    clip_high: float = 0.28
    updates_per_batch: int = 2
    micro_batch_rows: int = 32
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.99)
    skip_zero_advantage: bool = True
    on_policy_log_ratio_max: float = 1e-3
    seed: int = 0
    torch_threads: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.on_policy_log_ratio_max < 0:
            raise ValueError(f"trainer.on_policy_log_ratio_max must be >= 0, got {self.on_policy_log_ratio_max}")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"trainer.weighting must be one of {WEIGHTINGS}, got {self.weighting!r}")
        if not 0 < self.clip_low < 1 or self.clip_high <= 0:
            raise ValueError(f"clip range must satisfy 0 < clip_low < 1 and clip_high > 0, got "
                             f"({self.clip_low}, {self.clip_high})")
        self.adam_betas = tuple(self.adam_betas)  # Hydra passes lists

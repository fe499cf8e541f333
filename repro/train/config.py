"""The trainer's settings: where and how it runs (:class:`DeviceSettings`, shared by both phases) and one dataclass
per phase (Hydra groups mirror them one to one). No torch here: the torch side is :mod:`repro.train.device`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from repro.common.dataclass_floats import coerce_floats

DEVICES = ("cpu", "cuda", "auto")
WEIGHTINGS = ("rollout", "fragment")
OLD_LOGPROBS = ("recorded", "recompute")


@dataclass
class DeviceSettings:
    """The settings SFT and RL share (both configs inherit them; Hydra groups set them per phase).

    ``lora_rank`` 0 trains every weight; > 0 trains LoRA adapters on ``lora_target_modules`` (peft's
    ``all-linear`` by default) and saves merged weights, so a servable checkpoint never needs peft.
    ``fsdp`` shards parameters, gradients and optimizer state across the processes of a distributed launch
    (``fsdp_offload`` moves them to CPU memory); in a single process it changes nothing.
    """

    device: str = "cpu"  # cpu | cuda | auto (cuda when available)
    bf16: bool = False  # bf16 autocast (on this CPU measured ~9x slower than fp32: no native bf16 matmul)
    gradient_checkpointing: bool = False
    lora_rank: int = 0
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: str = "all-linear"
    fsdp: bool = False
    fsdp_offload: bool = False

    def __post_init__(self) -> None:
        coerce_floats(self)
        if self.device not in DEVICES:
            raise ValueError(f"trainer device must be one of {DEVICES}, got {self.device!r}")
        if self.lora_rank < 0:
            raise ValueError(f"lora_rank must be >= 0 (0: full fine-tuning), got {self.lora_rank}")


DEFAULT_DEVICE_SETTINGS = DeviceSettings()


@dataclass
class OptimizerSettings(DeviceSettings):
    """The optimizer fields both phases have (each phase sets its own default learning rate)."""

    learning_rate: float = 2e-4
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0
    torch_threads: int = 0  # 0 = torch's default (one per core)


def non_default_device_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` without the device fields that sit at their defaults (keeps cache keys made before they
    existed valid: the defaults reproduce the old behaviour)."""
    defaults = vars(DEFAULT_DEVICE_SETTINGS)
    return {k: v for k, v in settings.items() if k not in defaults or k == "bf16" or v != defaults[k]}


@dataclass
class SftConfig(OptimizerSettings):
    """Supervised warm start on demonstration rows (loss on sampled tokens only), run with trl's SFTTrainer.

    The schedule is warm-up, constant, then linear decay to ``min_lr_ratio`` (transformers' WSD schedule).
    Device, precision, gradient checkpointing and LoRA: :class:`DeviceSettings`.
    """

    epochs: float = 4.0
    batch_size: int = 16
    learning_rate: float = 3e-3
    warmup_steps: int = 30
    decay_fraction: float = 0.3
    min_lr_ratio: float = 0.1
    logging_steps: int = 50
    sampling: str = "random"  # batch order: random | group_by_length (rows of similar length share a batch)
    max_length: int = 0  # > 0: each row keeps only its last max_length tokens (left-truncated); 0: whole rows
    labelled_logits: bool = False  # the LM head on labelled positions only (trl does so on Triton devices only)
    decay_at_loss: float = 0.0  # > 0: the decay waits until the logged loss is below this (repro.train.sft_schedule)
    max_steps_factor: float = 2.0  # with a gated decay: at most this many times the epochs' steps in all
    holdout_every: int = 0  # > 0: every N-th row is held out of training and scored (repro.train.sft_holdout)
    holdout_steps: int = 100  # with holdout_every: score the held-out rows every this many steps
    decay_at_reproduced: float = 0.0  # > 0: the decay waits until this share of held-out later actions is
    # reproduced (needs holdout_every; instead of decay_at_loss)


@dataclass
class UpdateConfig(OptimizerSettings):
    """The policy-gradient update (GRPO/DAPO-style clipped objective, no KL term).

    ``weighting``: how a rollout's rows count — ``rollout`` (its rows share one rollout's weight) or
    ``fragment`` (each row counts as its own episode). ``updates_per_batch``: optimizer steps on the same
    rollouts (importance ratios against the recorded sampling logprobs keep later ones on-policy enough).
    ``on_policy_log_ratio_max``: the first update of every batch must see the policy that sampled it, so its
    max |log ratio| between the trainer's and the recorded logprobs above this fails the run (0: no check).
    ``ppo_mini_batch_rows`` > 0: verl's rule instead of ``updates_per_batch`` passes (:mod:`repro.train.batching`):
    ``min(max_ppo_updates, rows // ppo_mini_batch_rows)`` disjoint mini-batches, one optimizer step each (0: no cap).
    ``old_logprobs``: the ratio's denominator — ``recorded`` (the server's sampling logprobs) or ``recompute`` (the
    trainer's own before the step's first optimizer step; the first ratio is exactly 1). ``clip_ratio_c`` > 1:
    dual-clip PPO, a negative advantage's per-token loss capped at ``-A * clip_ratio_c`` (0: off).
    Device, precision, gradient checkpointing, LoRA and FSDP: :class:`DeviceSettings`; learning rate, weight decay,
    gradient clip, seed, threads: :class:`OptimizerSettings`.
    """

    weighting: str = "rollout"
    learning_rate: float = 2e-4
    clip_low: float = 0.2
    clip_high: float = 0.28
    updates_per_batch: int = 2
    micro_batch_rows: int = 32
    micro_batch_tokens: int = 16384  # padded tokens a forward pass at most (rows sorted by length; 0: rows only)
    adam_betas: tuple[float, float] = (0.9, 0.99)
    skip_zero_advantage: bool = True
    on_policy_log_ratio_max: float = 1e-3
    ppo_mini_batch_rows: int = 0  # 0: updates_per_batch passes over every row
    max_ppo_updates: int = 2  # the cap on mini-batches a step (with ppo_mini_batch_rows > 0; 0: no cap)
    old_logprobs: str = "recorded"  # recorded | recompute
    clip_ratio_c: float = 0.0  # dual-clip constant (> 1; 0: off)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ppo_mini_batch_rows < 0 or self.max_ppo_updates < 0:
            raise ValueError(f"trainer.ppo_mini_batch_rows and trainer.max_ppo_updates must be >= 0, got "
                             f"{self.ppo_mini_batch_rows} and {self.max_ppo_updates}")
        if self.micro_batch_rows < 1 or self.micro_batch_tokens < 0:
            raise ValueError(f"trainer.micro_batch_rows must be >= 1 and trainer.micro_batch_tokens >= 0 (0: rows "
                             f"only), got {self.micro_batch_rows} and {self.micro_batch_tokens}")
        if self.old_logprobs not in OLD_LOGPROBS:
            raise ValueError(f"trainer.old_logprobs must be one of {OLD_LOGPROBS}, got {self.old_logprobs!r}")
        if self.clip_ratio_c and not self.clip_ratio_c > 1:
            raise ValueError(f"trainer.clip_ratio_c must be > 1 (dual-clip PPO; verl uses 3.0) or 0 (off), got "
                             f"{self.clip_ratio_c}")
        if self.on_policy_log_ratio_max < 0:
            raise ValueError(f"trainer.on_policy_log_ratio_max must be >= 0, got {self.on_policy_log_ratio_max}")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"trainer.weighting must be one of {WEIGHTINGS}, got {self.weighting!r}")
        if not 0 < self.clip_low < 1 or self.clip_high <= 0:
            raise ValueError(f"clip range must satisfy 0 < clip_low < 1 and clip_high > 0, got "
                             f"({self.clip_low}, {self.clip_high})")
        self.adam_betas = tuple(self.adam_betas)  # Hydra passes lists

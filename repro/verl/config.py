"""``trainer=verl``: repro's update settings (:class:`repro.train.config.UpdateConfig`: the loss, clip, learning
rate, mini-batches) plus the systems settings of verl's actor and rollout as Agent Lightning's run set them
(``docs/recipe.md``, "Systems settings"). Plain data: no torch and no verl here, so the package's environment composes
and plans it; verl's environment runs it."""

from __future__ import annotations

from dataclasses import dataclass

from repro.train.config import UpdateConfig

STRATEGIES = ("fsdp2",)  # FSDP1 (verl's "fsdp", the published run's) does not run on CPU: the suite checks fsdp2


@dataclass
class VerlUpdateConfig(UpdateConfig):
    """Where verl's actor and its colocated vLLM replicas run and how they share each GPU. Defaults: one node of 8
    GPUs of 79.6 GiB (H100 80GB) with the recipe's settings; ``memory_layout`` names a layout of
    :data:`repro.memory_plan.LAYOUTS` instead ("" = these fields)."""

    strategy: str = "fsdp2"
    n_gpus_per_node: int = 8
    nnodes: int = 1
    gpu_memory_gib: float = 79.6  # memory of one GPU as nvidia-smi reports it
    param_offload: bool = True  # actor_rollout_ref.actor.fsdp_config.param_offload
    optimizer_offload: bool = True  # ...fsdp_config.optimizer_offload
    offload_policy: bool = False  # ...fsdp_config.offload_policy (FSDP2: states on CPU through the update too)
    use_fused_kernels: bool = True  # actor_rollout_ref.model.use_fused_kernels: log-probs in chunks
    logprob_chunk_tokens: int = 512
    use_remove_padding: bool = True
    ulysses_sequence_parallel_size: int = 1
    ppo_micro_batch_size_per_gpu: int = 1
    max_row_tokens: int = 81_920  # the longest row (actor_rollout_ref.rollout.max_model_len)
    rollout_gpu_memory_utilization: float = 0.8
    rollout_tensor_parallel_size: int = 1
    free_cache_engine: bool = True  # vLLM sleeps during the update
    update_weights_bucket_megabytes: int = 4096
    memory_layout: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.strategy not in STRATEGIES:
            raise ValueError(f"trainer.strategy={self.strategy!r}: choose one of {', '.join(STRATEGIES)}")
        if self.n_gpus_per_node < 1 or self.nnodes < 1 or self.ulysses_sequence_parallel_size < 1:
            raise ValueError("trainer.n_gpus_per_node, trainer.nnodes and trainer.ulysses_sequence_parallel_size "
                             "must be >= 1")

"""``trainer=verl``: repro's update settings (:class:`repro.train.config.UpdateConfig`: the loss, clip, learning
rate, mini-batches) plus the systems settings of verl's actor and rollout as Agent Lightning's run set them
(``docs/recipe.md``, "Systems settings"). Plain data: no torch and no verl here, so the package's environment composes
and plans it; verl's environment runs it."""

from __future__ import annotations

from dataclasses import dataclass

from repro.train.config import UpdateConfig

PLACEMENTS = ("auto", "process", "ray")
STRATEGIES = ("fsdp2",)  # FSDP1 (verl's "fsdp", the published run's) does not run on CPU: the suite checks fsdp2


@dataclass
class VerlUpdateConfig(UpdateConfig):
    """Where verl's actor and its colocated vLLM replicas run and how they share each GPU. Defaults: one node of 8
    GPUs of 79.6 GiB (H100 80GB) with the recipe's settings; ``memory_layout`` names a layout of
    :data:`repro.verl.memory_plan.LAYOUTS` instead ("" = these fields)."""

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
    placement: str = "auto"  # ray: verl's workers placed by Ray (GPUs need it) | process: one, in the worker | auto
    ray_address: str = ""  # a running Ray cluster ("auto": the one this node joined); "": a private one here
    tool_call_parser: str = "hermes"  # the replicas' vLLM tool-call parser (as serving=vllm's)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.strategy not in STRATEGIES:
            raise ValueError(f"trainer.strategy={self.strategy!r}: choose one of {', '.join(STRATEGIES)}")
        if self.n_gpus_per_node < 1 or self.nnodes < 1 or self.ulysses_sequence_parallel_size < 1:
            raise ValueError("trainer.n_gpus_per_node, trainer.nnodes and trainer.ulysses_sequence_parallel_size "
                             "must be >= 1")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"trainer.placement={self.placement!r}: choose one of {', '.join(PLACEMENTS)}")
        if self.on_gpus and self.placement == "process":
            raise ValueError("trainer=verl on GPUs places its workers with Ray: trainer.placement=ray")

    @property
    def on_gpus(self) -> bool:
        """verl's workers and its vLLM replicas on GPUs (else the CPU path: repro's CPU server is the rollout)."""
        return self.device != "cpu"

    def placement_settings(self) -> dict[str, object]:
        """What :mod:`repro.verl.worker` builds the actor from (:class:`repro.verl.cluster.Placement`'s fields)."""
        if self.placement == "process" or (self.placement == "auto" and not self.on_gpus):
            return {"kind": "process"}
        return {"kind": "ray", "nnodes": self.nnodes, "per_node": self.n_gpus_per_node, "address": self.ray_address,
                "rollout": self.on_gpus, "cpu": not self.on_gpus}

    def systems_overrides(self) -> list[str]:
        """verl ``ppo_trainer`` overrides for the systems settings (offload, fused log-probs, sequence parallel,
        gradient checkpointing, the colocated vLLM replicas and their weight sync)."""
        actor, rollout = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
        out = [f"{actor}.fsdp_config.param_offload={self.param_offload}",
               f"{actor}.fsdp_config.optimizer_offload={self.optimizer_offload}",
               f"{actor}.fsdp_config.offload_policy={self.offload_policy}",
               f"actor_rollout_ref.model.use_fused_kernels={self.use_fused_kernels}",
               f"actor_rollout_ref.model.use_remove_padding={self.use_remove_padding}",
               f"actor_rollout_ref.model.enable_gradient_checkpointing={self.gradient_checkpointing}",
               f"{actor}.ulysses_sequence_parallel_size={self.ulysses_sequence_parallel_size}",
               f"{actor}.ppo_micro_batch_size_per_gpu={self.ppo_micro_batch_size_per_gpu}",
               f"trainer.n_gpus_per_node={self.n_gpus_per_node}", f"trainer.nnodes={self.nnodes}"]
        if not self.on_gpus:
            return out
        return [*out, f"{rollout}.name=vllm", f"{rollout}.mode=async",
                      f"{rollout}.tensor_model_parallel_size={self.rollout_tensor_parallel_size}",
                      f"{rollout}.gpu_memory_utilization={self.rollout_gpu_memory_utilization}",
                      f"{rollout}.free_cache_engine={self.free_cache_engine}",
                      f"{rollout}.max_model_len={self.max_row_tokens}",
                      f"{rollout}.prompt_length={self.max_row_tokens // 2}",
                      f"{rollout}.response_length={self.max_row_tokens // 2}",
                      f"{rollout}.skip_tokenizer_init=false",  # the harness's chat calls need vLLM's template
                      f"{rollout}.checkpoint_engine.update_weights_bucket_megabytes="
                      f"{self.update_weights_bucket_megabytes}",
                      f"+{rollout}.engine_kwargs.vllm.enable_auto_tool_choice=true",
                      f"+{rollout}.engine_kwargs.vllm.tool_call_parser={self.tool_call_parser}",
                      "actor_rollout_ref.hybrid_engine=true"]

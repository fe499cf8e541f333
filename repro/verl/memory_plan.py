"""Per-GPU memory plan of the RL run on verl: what each GPU holds in the update and in the rollout phase, by
component, against its memory; a layout that does not fit is refused with the numbers and the settings to change.

verl's hybrid engine puts the FSDP trainer and a vLLM replica on every GPU. The update trains one row a GPU
(``ppo_micro_batch_size_per_gpu 1``) while vLLM sleeps (``free_cache_engine``) or stays awake; the rollout gives vLLM
its ``gpu_memory_utilization`` share. verl's ``param_offload`` / ``optimizer_offload`` move the trainer's states to
CPU between phases and back for the update (they shrink the rollout, not the update); FSDP2's ``offload_policy``
keeps them on CPU through the update too. Assumptions are :class:`Layout` fields with stated defaults; GiB = 2**30.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 2**30
DTYPE = {2: "bf16", 4: "fp32"}
LOGIT_BUFFERS = 2  # fp32 logits and their log-softmax (in the backward: their gradient) are live at once
VLLM_WEIGHT_BYTES = 2  # vLLM serves bf16 (the experiment's serving.dtype: bfloat16)


@dataclass(frozen=True)
class ModelShape:
    """A decoder's shape from a Hugging Face ``config.json``; :attr:`params` is ``n_params`` when given, else
    :meth:`formula_params` (GQA attention, SwiGLU MLP, RMSNorms). Hybrids miss that formula, so pass their count:
    Qwen3.5's Gated DeltaNet layers and gated attention give 8.95B parameters where the formula gives 8.21B."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    n_params: int | None = None

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str = "model", n_params: int | None = None) -> ModelShape:
        """Read a ``config.json`` dict; multimodal and hybrid checkpoints nest the decoder's under ``text_config``."""
        text = config.get("text_config") or config
        hidden, heads = int(text["hidden_size"]), int(text["num_attention_heads"])
        return cls(name, hidden, int(text["num_hidden_layers"]), heads,
                   int(text.get("num_key_value_heads") or heads), int(text.get("head_dim") or hidden // heads),
                   int(text["intermediate_size"]), int(text["vocab_size"]),
                   bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))), n_params)

    @property
    def embedding_params(self) -> int:  # V·h, twice when the output head is not tied to the embeddings
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def formula_params(self) -> int:
        """V·h embeddings (twice when untied) + L·(h·H·d + 2·h·K·d + H·d·h + 3·h·I + 2·h) + h (the final norm)."""
        h, d = self.hidden_size, self.head_dim
        layer = 2 * h * self.num_heads * d + 2 * h * self.num_kv_heads * d + 3 * h * self.intermediate_size + 2 * h
        return self.embedding_params + self.num_layers * layer + h

    @property
    def params(self) -> int:
        return self.n_params if self.n_params is not None else self.formula_params()

    @property
    def layer_params(self) -> float:
        """One layer's share of the parameters: all but the embeddings and the final norm, over the layers."""
        return (self.params - self.embedding_params - self.hidden_size) / self.num_layers

    @property
    def working_values_per_token(self) -> int:
        """Values one layer keeps a token for its backward: its two norm outputs (2h), q and the attention output
        (2·H·d), k and v (2·K·d), the MLP's gate, up, activation and their product (4·I)."""
        return (2 * self.hidden_size + 2 * self.num_heads * self.head_dim + 2 * self.num_kv_heads * self.head_dim
                + 4 * self.intermediate_size)


# Qwen3.5-9B's decoder (text_config of Qwen/Qwen3.5-9B), from
# [miles] radixark/miles scripts/models/qwen3.5-9B.sh @51b148c7 (Megatron args of the checkpoint) and
# [hf] transformers 5.25.0 Qwen3_5TextConfig defaults (models/qwen3_5/configuration_qwen3_5.py), which are the 9B's.
QWEN35_9B = ModelShape(
    name="Qwen3.5-9B",
    hidden_size=4096,  # [miles] --hidden-size 4096; [hf] hidden_size
    num_layers=32,  # [miles] --num-layers 32 (24 Gated DeltaNet + 8 gated-attention layers: [hf] layer_types)
    num_heads=16,  # [miles] --num-attention-heads 16
    num_kv_heads=4,  # [miles] --num-query-groups 4
    head_dim=256,  # [miles] --kv-channels 256; [hf] head_dim
    intermediate_size=12288,  # [miles] --ffn-hidden-size 12288
    vocab_size=248320,  # [miles] --vocab-size 248320
    tie_word_embeddings=False,  # [miles] --untie-embeddings-and-output-weights; [hf] tie_word_embeddings False
    # [hf] Qwen3_5ForCausalLM(Qwen3_5TextConfig()) built on the meta device counts 8,953,803,264 parameters (the
    # decoder; the vision encoder and the MTP head are not loaded by it); "8.95B" in the GGUF metadata quoted at
    # https://lzwjava.github.io/qwen3-5-9b-hybrid-review-en
    n_params=8_953_803_264,
)

# GPU memory per device, in GiB as nvidia-smi reports it:
H100_GIB = 81_559 / 1024  # H100 80GB: 81,559 MiB (https://thundergolfer.com/blog/nvidia-gpu-memory-capacity)
# HGX B200: 179 (nvidia-smi, https://docs.vultr.com/inference-cookbook/cuda/getting-started/hardware-overview);
# NVIDIA quotes 180 GB a GPU for HGX B200 (https://hpc-ai.com/blog/B200-Practical-Considerations-for-AI-Teams),
# 192 GB is the package's raw HBM3e (https://glennklockwood.com/garden/processors/B200). The tests check that
# b200_x4 fits at 180e9 bytes (167.6 GiB) too.
B200_GIB = 179.0


@dataclass(frozen=True)
class Layout:
    """Where the run's pieces sit and what they keep; the training world is every GPU (hybrid engine). "recipe":
    agent-lightning examples/swe_smith/train_smith_agent.py, the verl overrides of the published run."""

    name: str
    gpu_gib: float  # memory per GPU
    gpus_per_node: int
    nodes: int = 1
    compute_bytes: int = 2  # compute params: bf16
    master_bytes: int = 4  # master params, grads, AdamW moments: fp32
    fsdp: bool = True  # shard params, grads and optimizer states over the world
    param_offload: bool = True  # verl: params on CPU between phases, on the GPU for the update
    optimizer_offload: bool = True  # verl: AdamW moments likewise
    offload_policy: bool = False  # FSDP2 CPUOffloadPolicy: params, grads and moments on CPU through the update too
    gradient_checkpointing: bool = True
    ulysses_sp: int = 1  # ulysses_sequence_parallel_size: a row's tokens split over this many GPUs
    micro_batch_tokens: int = 81_920  # longest row, one a GPU: a merged row is one call, <= recipe max_model_len
    logprob_chunk: int | None = 512  # verl FusedLinearForPPO chunk_size 512 (utils/experimental/torch_functional.py)
    vllm_share: float = 0.8  # gpu_memory_utilization (recipe 0.8)
    vllm_sleeps: bool = True  # free_cache_engine: vLLM sleeps during the update
    vllm_tp: int = 1  # vLLM tensor parallel size (one replica a GPU at 1)
    # Assumptions, not measured here:
    vllm_asleep_gib: float = 2.0  # what a sleeping vLLM keeps: CUDA graphs, allocator pools
    context_gib: float = 2.0  # CUDA contexts of the trainer and vLLM processes and NCCL buffers
    fragmentation: float = 0.05  # share of the GPU lost to the caching allocator's fragmentation
    sync_bucket_gib: float = 4.0  # weight-sync bucket (recipe: update_weights_bucket_megabytes 4096)

    def __post_init__(self) -> None:
        if self.world % self.ulysses_sp or self.micro_batch_tokens <= 0 or not 0 < self.vllm_share <= 1:
            raise ValueError(f"layout {self.name}: ulysses_sp must divide the world ({self.world}), rows must have "
                             "tokens and gpu_memory_utilization must be in (0, 1]")

    @property
    def world(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def shards(self) -> int:
        return self.world if self.fsdp else 1

    @property
    def tokens_per_gpu(self) -> int:
        return math.ceil(self.micro_batch_tokens / self.ulysses_sp)


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per GPU by component in each phase, and host RAM per node for what is offloaded."""

    model: ModelShape
    layout: Layout
    phases: dict[str, dict[str, float]]  # "update", "rollout" -> component -> bytes a GPU
    host_bytes_per_node: float

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=lambda phase: sum(self.phases[phase].values()))

    @property
    def peak_bytes(self) -> float:
        return sum(self.phases[self.peak_phase].values())

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.layout.gpu_gib * GIB


class MemoryPlanError(ValueError):
    """A layout whose peak exceeds its GPU memory."""


def trainer_states(model: ModelShape, layout: Layout) -> dict[str, float]:
    """The trainer's states on a GPU, over S shards (world with ``fsdp``, else 1): compute params N·c/S, master params
    N·m/S (where c != m), grads N·m/S (on the master shard), AdamW moments 2·N·m/S. FSDP2 casts the master shard per
    unit when it gathers, so the compute-params term is an upper bound that also stands for those casts."""
    n, s, c, m = model.params, layout.shards, layout.compute_bytes, layout.master_bytes
    return {f"params ({DTYPE.get(c, c)})": n * c / s, f"master params ({DTYPE.get(m, m)})": n * m / s if c != m else 0,
            "grads": n * m / s, "AdamW moments": 2 * n * m / s}


def activation_bytes(model: ModelShape, layout: Layout) -> float:
    """Activations of one row, t = T/sp tokens on a GPU (Ulysses splits the sequence). With checkpointing each layer's
    input is kept, t·h·c·L, plus one layer's working set while it is recomputed and back-propagated, t·w·c·2 (w values a
    token, :attr:`ModelShape.working_values_per_token`, doubled for their gradients); without it every layer keeps its
    working set, t·w·c·L, plus one layer's gradients, t·w·c. Cross-check: w·c is 33h bytes a token for Qwen3.5-9B
    against 34h for GPT layers in Korthikanti et al. 2022 (arXiv:2205.05198, eq. 1 less the attention-score term,
    which flash attention never materialises). Gated DeltaNet layers are approximated as attention layers."""
    t, c = layout.tokens_per_gpu, layout.compute_bytes
    working = t * model.working_values_per_token * c
    if layout.gradient_checkpointing:
        return t * model.hidden_size * c * model.num_layers + 2 * working
    return working * (model.num_layers + 1)


def logit_bytes(model: ModelShape, layout: Layout) -> float:
    """fp32 logits of ``logprob_chunk`` tokens at a time (verl's fused kernels), else of the GPU's whole share of the
    row, t = T/sp: rows·V·4 bytes, times 2 for the log-softmax (in the backward: the gradient) live beside them."""
    rows = min(layout.logprob_chunk or layout.tokens_per_gpu, layout.tokens_per_gpu)
    return LOGIT_BUFFERS * rows * model.vocab_size * 4


def _reserve(layout: Layout) -> float:  # CUDA contexts, NCCL buffers, allocator fragmentation
    return (layout.context_gib + layout.fragmentation * layout.gpu_gib) * GIB


def _update_phase(model: ModelShape, layout: Layout) -> dict[str, float]:
    """States (on CPU under ``offload_policy``), two gathered FSDP units (current and prefetched layer, params and
    unsharded grads: 4·layer·c), activations, logits, vLLM (share awake, ``vllm_asleep_gib`` asleep), reserve."""
    parts = {k: 0.0 if layout.offload_policy else v for k, v in trainer_states(model, layout).items()}
    gathered = layout.shards > 1 or layout.offload_policy
    parts["gathered FSDP units"] = 4 * model.layer_params * layout.compute_bytes if gathered else 0.0
    parts["activations"] = activation_bytes(model, layout)
    parts["logits"] = logit_bytes(model, layout)
    parts["vLLM (asleep)" if layout.vllm_sleeps else "vLLM (awake)"] = (
        layout.vllm_asleep_gib * GIB if layout.vllm_sleeps else layout.vllm_share * layout.gpu_gib * GIB)
    parts["reserve"] = _reserve(layout)
    return parts


def _rollout_phase(model: ModelShape, layout: Layout) -> dict[str, float]:
    """vLLM's share; params and AdamW moments unless offloaded; no grads (each optimizer step frees them:
    ``zero_grad(set_to_none=True)``, PyTorch's default); the weight-sync bucket; the reserve."""
    params_off = layout.param_offload or layout.offload_policy
    moments_off = layout.optimizer_offload or layout.offload_policy
    parts = {name: 0.0 if name == "grads" or (moments_off if name == "AdamW moments" else params_off) else size
             for name, size in trainer_states(model, layout).items()}
    parts["vLLM (awake)"] = layout.vllm_share * layout.gpu_gib * GIB
    parts["weight-sync bucket"] = layout.sync_bucket_gib * GIB
    parts["reserve"] = _reserve(layout)
    return parts


def _host_bytes_per_gpu(model: ModelShape, layout: Layout) -> float:
    """CPU RAM a GPU needs, the larger of the phases: rollout, the offloaded states; update, the states kept on CPU
    by ``offload_policy`` plus a sleeping vLLM's bf16 weights (N·2/tp)."""
    states = trainer_states(model, layout)
    rollout = sum(size - _rollout_phase(model, layout)[name] for name, size in states.items() if name != "grads")
    update = (sum(states.values()) if layout.offload_policy else 0.0) + (
        model.params * VLLM_WEIGHT_BYTES / layout.vllm_tp if layout.vllm_sleeps else 0.0)
    return max(rollout, update)


def plan_memory(model: ModelShape, layout: Layout) -> MemoryPlan:
    """Per-GPU bytes by component in the update and the rollout phases; the peak is the larger phase."""
    phases = {"update": _update_phase(model, layout), "rollout": _rollout_phase(model, layout)}
    return MemoryPlan(model, layout, phases, _host_bytes_per_gpu(model, layout) * layout.gpus_per_node)


def _remedies(name: str, phase: str, layout: Layout) -> list[str]:
    """The settings (verl's keys) that shrink component ``name`` in ``phase``."""
    fsdp, sp = "actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
    if name.startswith(("params", "master", "grads", "AdamW")) and phase == "rollout":
        return [f"{fsdp}.optimizer_offload=true" if name == "AdamW moments" else f"{fsdp}.param_offload=true"]
    if name.startswith(("params", "master", "grads", "AdamW")):
        return [f"more GPUs (states scale 1/world, now {layout.world}: trainer.n_gpus_per_node, trainer.nnodes)",
                f"{fsdp}.offload_policy=true (FSDP2 keeps the states on CPU through the update)",
                *(["bf16 compute params with fp32 master weights"] if layout.compute_bytes == 4 else []),
                *(["FSDP sharding (actor_rollout_ref.actor.strategy=fsdp2)"] if not layout.fsdp else [])]
    if name == "activations":
        checkpointing = "actor_rollout_ref.model.enable_gradient_checkpointing=true"
        return [*([] if layout.gradient_checkpointing else [checkpointing]),
                f"a larger {sp} (now {layout.ulysses_sp}, at most the world, {layout.world})",
                f"shorter rows (now {layout.micro_batch_tokens:,} tokens: actor_rollout_ref.rollout.max_model_len)"]
    if name == "logits":
        return (["actor_rollout_ref.model.use_fused_kernels=true (log-probs in chunks of 512 tokens)"]
                if layout.logprob_chunk is None else [f"a smaller log-prob chunk (now {layout.logprob_chunk})"])
    if name == "vLLM (awake)" and phase == "update":
        return ["actor_rollout_ref.rollout.free_cache_engine=true (vLLM sleeps during the update)"]
    if name == "vLLM (awake)":
        return [f"a lower actor_rollout_ref.rollout.gpu_memory_utilization (now {layout.vllm_share})"]
    return []


def refuse_if_not_fits(plan: MemoryPlan) -> None:
    """Raise :class:`MemoryPlanError` naming the peak, the capacity, the components of at least a tenth of the peak
    phase (the largest first, with their GiB) and the settings that shrink them."""
    if plan.fits:
        return
    phase = plan.peak_phase
    top = [(n, b) for n, b in sorted(plan.phases[phase].items(), key=lambda nb: -nb[1]) if b >= plan.peak_bytes / 10]
    remedies = list(dict.fromkeys(r for name, _ in top for r in _remedies(name, phase, plan.layout)))
    raise MemoryPlanError(
        f"{plan.model.name} on layout {plan.layout.name} does not fit: peak {plan.peak_bytes / GIB:.1f} GiB a GPU "
        f"({phase} phase) > {plan.layout.gpu_gib:.1f} GiB of GPU memory. Largest: "
        + ", ".join(f"{name} {size / GIB:.1f} GiB" for name, size in top)
        + ". Change: " + ("; ".join(remedies) or "more GPU memory") + ".")


def format_plan(plan: MemoryPlan) -> str:
    """One line per component per phase (GiB), each phase's total, host RAM, the peak, the capacity, the verdict."""
    lay = plan.layout
    lines = [f"Memory plan: {plan.model.name} ({plan.model.params / 1e9:.2f}B params) on {lay.name}: {lay.nodes} "
             f"node(s) x {lay.gpus_per_node} GPUs of {lay.gpu_gib:.1f} GiB; FSDP over {lay.shards}, sp "
             f"{lay.ulysses_sp}, rows {lay.micro_batch_tokens:,} tokens, log-prob chunk {lay.logprob_chunk or 'none'}, "
             f"vLLM {lay.vllm_share} tp {lay.vllm_tp} "
             f"{'asleep' if lay.vllm_sleeps else 'awake'} in the update"]
    for phase, parts in plan.phases.items():
        lines += [f"  {phase:<8}{name:<28}{size / GIB:9.2f} GiB" for name, size in [*parts.items(), ("total", sum(
            parts.values()))]]
    lines += [f"  host RAM a node (offloaded states, sleeping vLLM): {plan.host_bytes_per_node / GIB:.1f} GiB",
              f"  peak {plan.peak_bytes / GIB:.1f} GiB ({plan.peak_phase}) of {lay.gpu_gib:.1f} GiB: "
              + ("fits" if plan.fits else "DOES NOT FIT")]
    return "\n".join(lines) + "\n"


LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in (
    # The published run (train_smith_agent.py): 4 x B200, sp 1, param + optimizer offload, fused kernels, vLLM at 0.8
    # asleep in the update. The rollout phase sets the peak (0.8 of the GPU + bucket + reserve); the update (~94 GiB
    # for an 81,920-token row) has room, so sp 1 suffices.
    Layout("b200_x4", B200_GIB, gpus_per_node=4),
    # 8 x H100 80GB, one node: states /8 (~19 GiB); sp 2 halves an 81,920-token row's activations (~41 -> ~20 GiB),
    # keeping the update ~30 GiB under the GPU for the approximate Gated DeltaNet working set (2 divides Qwen3.5's 16
    # query, 4 KV, 16/32 linear-attention heads; verl's Ulysses patch must cover those layers). Offload is required:
    # vLLM's 0.8 share (63.7 GiB) leaves no room for the states in the rollout phase.
    Layout("h100_x8", H100_GIB, gpus_per_node=8, ulysses_sp=2),
    # 2 nodes of 8 x H100: states /16 (~9 GiB), so sp 1 fits an 81,920-token row (~60 GiB update) without the
    # unverified Ulysses path for Gated DeltaNet; 16 vLLM replicas (tp 1); offload still required for the rollout.
    Layout("h100_x8_x2", H100_GIB, gpus_per_node=8, nodes=2),
    # repro's old path: one process on GPU 0, no sharding, fp32 full fine-tune (fp32 weights, grads and AdamW:
    # 16 bytes a parameter), full fp32 logits, vLLM awake at 0.85 (serving.gpu_memory_utilization) beside it; vLLM
    # reloads a checkpoint folder (repro.serving.sync), no sync bucket. Refused even on a B200.
    Layout("single_process_gpu0", B200_GIB, gpus_per_node=1, compute_bytes=4, fsdp=False, param_offload=False,
           optimizer_offload=False, logprob_chunk=None, vllm_share=0.85, vllm_sleeps=False, sync_bucket_gib=0.0),
    # verl with everything on one H100 80GB: nothing to shard over, the update reloads ~150 GiB of states.
    Layout("one_gpu_verl", H100_GIB, gpus_per_node=1),
)}


def print_memory_plans(names: list[str], model_config: str | None = None) -> bool:
    """Print the plan of each named layout (comma-separated names allowed); refusals go to stderr. True: all fit."""
    model = QWEN35_9B if not model_config else ModelShape.from_hf_config(
        json.loads(Path(model_config).read_text()), name=Path(model_config).resolve().parent.name or "model")
    fits = True
    for name in [n.strip() for item in names for n in item.split(",") if n.strip()]:
        if name not in LAYOUTS:
            raise SystemExit(f"unknown memory layout {name!r}: choose from {', '.join(LAYOUTS)}")
        plan = plan_memory(model, LAYOUTS[name])
        print(format_plan(plan), end="")
        try:
            refuse_if_not_fits(plan)
        except MemoryPlanError as exc:
            print(f"refused: {exc}", file=sys.stderr)
            fits = False
    return fits

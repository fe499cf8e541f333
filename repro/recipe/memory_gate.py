"""The job's first check at scale: will the policy update and the model server fit the GPUs? Computed from the
checkpoint's ``config.json`` and the trainer's settings (:mod:`repro.verl.memory_plan`), printed, and refused before
anything is loaded, evaluated or trained, so that a layout that cannot fit costs seconds, not hours."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from repro.verl.config import VerlUpdateConfig
from repro.verl.memory_plan import (
    H100_GIB,
    LAYOUTS,
    Layout,
    MemoryPlan,
    ModelShape,
    format_plan,
    plan_memory,
    refuse_if_not_fits,
)

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def model_shape(checkpoint: str | Path) -> ModelShape:
    """The decoder's shape from ``<checkpoint>/config.json``; its parameter count from the safetensors index's total
    size over the stored dtype's bytes when there is one (hybrids miss the formula), else the formula."""
    folder = Path(checkpoint)
    config = json.loads((folder / "config.json").read_text())
    index = folder / "model.safetensors.index.json"
    n_params = None
    if index.is_file():
        total = json.loads(index.read_text()).get("metadata", {}).get("total_size")
        dtype = (config.get("text_config") or config).get("torch_dtype") or config.get("torch_dtype") or "bfloat16"
        n_params = int(total) // _BYTES.get(str(dtype), 2) if total else None
    return ModelShape.from_hf_config(config, name=folder.resolve().name, n_params=n_params)


def verl_layout(update: VerlUpdateConfig) -> Layout:
    """The layout of ``trainer=verl``'s settings (or the named layout they point at)."""
    if update.memory_layout:
        if update.memory_layout not in LAYOUTS:
            raise SystemExit(f"error: trainer.memory_layout={update.memory_layout!r}: choose one of "
                             f"{', '.join(LAYOUTS)}")
        return LAYOUTS[update.memory_layout]
    return Layout("trainer=verl", update.gpu_memory_gib, update.n_gpus_per_node, update.nnodes,
                  compute_bytes=2 if update.bf16 else 4, param_offload=update.param_offload,
                  optimizer_offload=update.optimizer_offload, offload_policy=update.offload_policy,
                  gradient_checkpointing=update.gradient_checkpointing,
                  ulysses_sp=update.ulysses_sequence_parallel_size, micro_batch_tokens=update.max_row_tokens,
                  logprob_chunk=update.logprob_chunk_tokens if update.use_fused_kernels else None,
                  vllm_share=update.rollout_gpu_memory_utilization, vllm_sleeps=update.free_cache_engine,
                  vllm_tp=update.rollout_tensor_parallel_size,
                  sync_bucket_gib=update.update_weights_bucket_megabytes / 1024)


def gpu_gib() -> float | None:
    """The first GPU's memory (nvidia-smi), or None without one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    out = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"], capture_output=True,
                         text=True, timeout=30)
    return float(out.stdout.split()[0]) / 1024 if out.returncode == 0 and out.stdout.strip() else None


def single_process_layout(update: Any, serving: Any) -> Layout:
    """repro's own trainer at scale: one process with the whole model on one GPU beside the model server
    (``serving.gpu_memory_utilization``, awake during the update), full logits; bf16 autocast keeps fp32 weights."""
    share = float(getattr(serving, "gpu_memory_utilization", 0.0) or 0.0)
    return dataclasses.replace(LAYOUTS["single_process_gpu0"], name="repro's own trainer, one process",
                               gpu_gib=gpu_gib() or H100_GIB, vllm_share=share,
                               gradient_checkpointing=bool(getattr(update, "gradient_checkpointing", False)))


def memory_gate(update: Any, serving: Any, checkpoint: str | None) -> MemoryPlan | None:
    """Print the per-GPU memory plan of this run and refuse (``SystemExit`` with the numbers and the settings to
    change) when it does not fit; None (nothing to plan) for a trainer on the CPU or without a checkpoint."""
    on_gpu = isinstance(update, VerlUpdateConfig) or getattr(update, "device", "cpu") == "cuda"
    if not on_gpu or not checkpoint or not (Path(checkpoint) / "config.json").is_file():
        return None
    try:
        layout = verl_layout(update) if isinstance(update, VerlUpdateConfig) else single_process_layout(update,
                                                                                                      serving)
        plan = plan_memory(model_shape(checkpoint), layout)
        print(format_plan(plan), end="", flush=True)
        refuse_if_not_fits(plan)
    except ValueError as exc:  # an impossible layout, or one that does not fit
        raise SystemExit(f"error: {exc}") from None
    return plan

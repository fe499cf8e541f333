"""Where and how the one trainer runs: device, precision, gradient checkpointing, LoRA and FSDP, through accelerate
(the settings: :class:`~repro.train.config.DeviceSettings`; the helpers here are the torch side, used by RL and SFT).

The CPU miniature runs with every setting at its default (fp32 on the CPU, full fine-tuning): accelerate then wraps
nothing and the numbers are those of a plain torch loop. On GPUs the same :class:`~repro.train.rl.PolicyTrainer`
and SFT use bf16 autocast, gradient checkpointing, LoRA adapters (peft) and, when the process is started by a
distributed launcher (``accelerate launch`` / ``torchrun``), FSDP with optional CPU offload.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from repro.train.config import DeviceSettings

LORA_HINT = "LoRA needs peft: pip install -e '.[lora]' (or set trainer.lora_rank=0 for full fine-tuning)"


def resolve_device(name: str) -> str:
    """``cpu`` or ``cuda``; ``auto`` picks cuda when torch sees a GPU. Asking for cuda without one is an error."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer device=cuda, but torch sees no GPU (torch.cuda.is_available() is False); "
                           "use device=cpu or auto, or install a CUDA build of torch (the gpu extra)")
    return name


def distributed() -> bool:
    """True inside a multi-process launch (``accelerate launch`` / ``torchrun`` set WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def make_accelerator(settings: DeviceSettings) -> Any:
    """An ``accelerate.Accelerator`` for ``settings``. In a single process a state left by an earlier phase with
    other settings (e.g. a bf16 SFT before an fp32 RL phase) is reset instead of refused."""
    from accelerate import Accelerator, FullyShardedDataParallelPlugin
    from accelerate.state import AcceleratorState

    kwargs: dict[str, Any] = {"cpu": resolve_device(settings.device) == "cpu",
                              "mixed_precision": "bf16" if settings.bf16 else "no"}
    if settings.fsdp and distributed():
        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(cpu_offload=settings.fsdp_offload,
                                                               activation_checkpointing=settings.gradient_checkpointing)
    try:
        return Accelerator(**kwargs)
    except ValueError:
        if distributed():
            raise
        AcceleratorState._reset_state(reset_partial_state=True)
        return Accelerator(**kwargs)


def lora_config(settings: DeviceSettings) -> Any:
    """peft's ``LoraConfig`` for ``settings`` (None for full fine-tuning)."""
    if not settings.lora_rank:
        return None
    try:
        from peft import LoraConfig
    except ImportError as exc:
        raise ImportError(LORA_HINT) from exc
    return LoraConfig(r=settings.lora_rank, lora_alpha=settings.lora_alpha, lora_dropout=settings.lora_dropout,
                      target_modules=settings.lora_target_modules, task_type="CAUSAL_LM")


def prepare_model(model: torch.nn.Module, settings: DeviceSettings) -> torch.nn.Module:
    """Gradient checkpointing and LoRA adapters on a freshly loaded model (before accelerate's ``prepare``)."""
    if settings.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    config = lora_config(settings)
    if config is None:
        return model
    from peft import get_peft_model

    if settings.gradient_checkpointing:
        model.enable_input_require_grads()
    return get_peft_model(model, config)


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights of ``model`` as the base architecture names them, LoRA adapters merged in (no peft needed to
    load or serve them). ``model`` is left as it was (adapters unmerged)."""
    if not hasattr(model, "merge_adapter"):
        return {k: v for k, v in model.state_dict().items()}
    model.merge_adapter()
    try:
        base = model.get_base_model()
        return {key.replace(".base_layer", ""): value.detach().clone()
                for key, value in base.state_dict().items() if ".lora_" not in key}
    finally:
        model.unmerge_adapter()


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under peft's wrapper (the model itself without LoRA)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model

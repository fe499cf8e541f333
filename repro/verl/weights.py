"""The actor's weights out of verl's FSDP2 engine: gathered from every rank onto the CPU (a collective: every rank
calls it), and written by rank 0 over an existing checkpoint file with that file's tensor names."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def full_state(worker: Any) -> dict[str, Any]:
    """The actor's weights gathered from every rank (FSDP2), on the CPU, by parameter name."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    module = worker.actor.engine.module
    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def write_weights(worker: Any, target: Path) -> int:
    """Overwrite the safetensors file ``target`` with the actor's weights (the names it already holds: a tied
    checkpoint stays tied); every rank gathers, rank 0 writes. The number of tensors written (0 on other ranks)."""
    import torch.distributed as dist
    from safetensors import safe_open
    from safetensors.torch import save_file

    state = full_state(worker)
    if dist.is_initialized() and dist.get_rank() != 0:
        return 0
    with safe_open(str(target), "pt") as existing:
        names = set(existing.keys())
    save_file({k: v.clone().contiguous() for k, v in state.items() if k in names}, str(target))
    return len(names & set(state))

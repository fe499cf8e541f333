"""verl's real actor on repro's rows: ``ActorRolloutRefWorker`` built from verl's own Hydra ``ppo_trainer`` config
(FSDP2 engine, remove-padding, sdpa attention), fed the rows as verl's batch through verl's own
padding-to-no-padding conversion, asked for log-probs (``compute_log_prob``) and for an update (``update_actor``),
exactly as verl's trainer asks it. Runs in verl's environment; on a machine without a GPU after
:func:`repro.verl.cpu_platform.register`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from repro.verl.batch import RowLike, response_values, to_dataproto

SINGLE_PROCESS_ENV = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}


def actor_overrides(model_dir: Path, mini_batch_rows: int, lr: float = 1e-3, param_dtype: str = "bf16",
                    extra: Sequence[str] = ()) -> list[str]:
    """verl ``ppo_trainer`` overrides for repro's update: FSDP2, remove-padding, one row per micro-batch (the
    recipe's ``ppo_micro_batch_size_per_gpu 1``), a constant learning rate without warm-up, no KL, no entropy;
    ``param_dtype``: FSDP's compute dtype (``bf16`` as verl runs on GPUs; ``fp32`` to compare with repro's fp32
    trainer on CPU)."""
    precision = f"{{param_dtype:{param_dtype},reduce_dtype:fp32,buffer_dtype:fp32}}"
    return [f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.actor.strategy=fsdp2",
            "actor_rollout_ref.model.use_remove_padding=true",
            "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini_batch_rows}",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1", "actor_rollout_ref.rollout.n=1",
            f"actor_rollout_ref.actor.optim.lr={lr}", "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.0",
            "actor_rollout_ref.actor.use_kl_loss=false", "actor_rollout_ref.actor.entropy_coeff=0.0",
            "actor_rollout_ref.actor.shuffle=false",
            f"+actor_rollout_ref.actor.fsdp_config.mixed_precision={precision}", *extra]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def verl_config(overrides: Sequence[str]) -> Any:
    """verl's own ``ppo_trainer`` config (from verl's package), composed with ``overrides``."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=list(overrides))


def build_actor(config: Any) -> Any:
    """An initialised ``ActorRolloutRefWorker`` (role ``actor``) of ``config.actor_rollout_ref`` in this process
    (its rank and world come from ``RANK`` / ``WORLD_SIZE``: torchrun's, or one process)."""
    from verl.workers.engine_workers import ActorRolloutRefWorker

    for key, value in SINGLE_PROCESS_ENV.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(_free_port()))  # torchrun sets its own
    worker = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor")
    worker.init_model()
    return worker


def _tensordict(rows: Sequence[RowLike], pad_id: int, **meta: Any) -> tuple[Any, Any]:
    """(verl's no-padding TensorDict, the padded one's copy for slicing outputs back) of the rows."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    padded = to_dataproto(rows, pad_id).to_tensordict()
    reference = padded.clone()
    data = left_right_2_no_padding(padded)
    tu.assign_non_tensor(data, **meta)
    return data, reference


def compute_log_probs(worker: Any, rows: Sequence[RowLike], pad_id: int, temperature: float = 1.0) -> list[list[float]]:
    """verl's ``compute_log_prob`` of each row's response tokens (what verl's trainer calls the old log-probs) at the
    sampling ``temperature`` (verl divides the logits by it, as the server sampled)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    data, reference = _tensordict(rows, pad_id, calculate_entropy=False, compute_loss=False,
                                  temperature=temperature)
    output = worker.compute_log_prob(data)
    log_probs = no_padding_2_padding(tu.get(output, "log_probs"), reference)
    return response_values(log_probs.float(), rows)


def update(worker: Any, rows: Sequence[RowLike], pad_id: int, old_log_probs: list[list[float]],
           temperature: float = 1.0, global_rows: int = 0) -> dict[str, Any]:
    """One ``update_actor`` call: this rank's ``rows`` as its share of one mini-batch of ``global_rows`` rows over
    all ranks (0: ``rows`` are all of it), verl's PPO loss against ``old_log_probs`` and the rows' advantages;
    returns verl's metrics."""
    from verl.utils import tensordict_utils as tu

    data, _ = _tensordict(rows, pad_id)
    width = data["response_mask"].shape[1]
    old = torch.stack([torch.tensor(list(v) + [0.0] * (width - len(v)), dtype=torch.float32) for v in old_log_probs])
    data["old_log_probs"] = old
    total = global_rows or len(rows)
    tu.assign_non_tensor(data, calculate_entropy=False, global_batch_size=total, mini_batch_size=total,
                         epochs=1, seed=0, dataloader_kwargs={"shuffle": False}, compute_loss=True,
                         temperature=temperature, multi_turn=True, distillation_use_topk=False,
                         distillation_only=False)
    return tu.get(worker.update_actor(data), "metrics")

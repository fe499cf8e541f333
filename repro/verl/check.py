"""``python -m repro.verl.check {advantages,batch,logprobs,update} ...`` in verl's environment: verl's real
actor (and its GRPO advantage) on rows written by the package (:func:`repro.verl.batch.rows_to_json`), its answers
written back as JSON / safetensors, so that the package's suite can hold verl to repro's own trainer
(``tests/verl_engine/``). ``update`` runs in one process or under ``torchrun --nproc_per_node N`` (gloo on CPU: the
rows are sharded over the ranks as verl's data parallelism shards them; rank 0 writes the gathered weights).

Without an NVIDIA GPU the CPU platform (:mod:`repro.verl.cpu_platform`) is registered first.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any


def ensure_platform() -> None:
    """verl's own platform on an NVIDIA machine, else the CPU platform."""
    from repro.serving.vllm_env import has_nvidia_device  # standard library only: loads in verl's environment

    if not has_nvidia_device():
        from repro.verl.cpu_platform import register

        register()


def _worker(args: argparse.Namespace, rows: list[Any]) -> Any:
    from repro.verl.actor import actor_overrides, build_actor, verl_config

    overrides = actor_overrides(Path(args.model), len(rows), lr=args.lr, param_dtype=args.param_dtype)
    return build_actor(verl_config(overrides))


def run_logprobs(args: argparse.Namespace) -> None:
    from repro.verl.actor import compute_log_probs
    from repro.verl.batch import rows_from_json

    rows = rows_from_json(Path(args.rows))
    worker = _worker(args, rows)
    Path(args.out).write_text(json.dumps(compute_log_probs(worker, rows, args.pad_id, args.temperature)))


def run_advantages(args: argparse.Namespace) -> None:
    """verl's GRPO advantage of each rollout (:mod:`repro.verl.advantages`), as JSON."""
    from repro.verl.advantages import rollout_advantages
    from repro.verl.batch import rows_from_json

    Path(args.out).write_text(json.dumps(rollout_advantages(rows_from_json(Path(args.rows)), args.epsilon)))


def run_batch(args: argparse.Namespace) -> None:
    """The rows as verl's batch, after verl's own padding -> no-padding conversion: per row, the token sequence verl's
    actor reads, its loss mask, response ids and sampling logprobs (to hold the conversion to repro's rows)."""
    from verl.workers.utils.padding import left_right_2_no_padding

    from repro.verl.batch import response_values, rows_from_json, to_dataproto

    rows = rows_from_json(Path(args.rows))
    padded = to_dataproto(rows, args.pad_id).to_tensordict()
    responses = response_values(padded["responses"].float(), rows)
    response_mask = response_values(padded["response_mask"].float(), rows)
    logprobs = response_values(padded["rollout_log_probs"], rows)
    data = left_right_2_no_padding(padded.clone())
    sequences = [t.tolist() for t in data["input_ids"].unbind()]
    Path(args.out).write_text(json.dumps([
        {"input_ids": seq, "responses": [int(x) for x in resp], "response_mask": [int(x) for x in mask],
         "rollout_log_probs": lps, "uid": str(data["uid"][i]) if "uid" in data else None}
        for i, (seq, resp, mask, lps) in enumerate(zip(sequences, responses, response_mask, logprobs, strict=True))]))


def run_update(args: argparse.Namespace) -> None:
    """verl's old log-probs, then one ``update_actor`` over all rows as one mini-batch; rank 0 writes
    ``weights.safetensors`` (after the step) and ``metrics.json``. With ``--ray N`` the actor is a Ray worker group
    of N workers (:mod:`repro.verl.cluster`) driven from this one process, as the RL loop drives it."""
    if args.ray:
        return _ray_update(args)
    import torch.distributed as dist
    from safetensors.torch import save_file

    from repro.verl.actor import compute_log_probs, update
    from repro.verl.batch import rows_from_json
    from repro.verl.weights import full_state

    rows = rows_from_json(Path(args.rows))
    worker = _worker(args, rows)  # the mini-batch is every row, over all ranks
    mine = shard(rows, int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")))
    old = compute_log_probs(worker, mine, args.pad_id, args.temperature)
    metrics = update(worker, mine, args.pad_id, old, args.temperature, global_rows=len(rows))
    state = full_state(worker)
    if int(os.environ.get("RANK", "0")) == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.clone().contiguous() for k, v in state.items()}, str(out / "weights.safetensors"))
        (out / "metrics.json").write_text(json.dumps(_plain(metrics)))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _ray_update(args: argparse.Namespace) -> None:
    import shutil

    from repro.verl.actor import actor_overrides, compute_log_probs, update, verl_config
    from repro.verl.batch import rows_from_json
    from repro.verl.cluster import ActorGroup, Placement

    rows = rows_from_json(Path(args.rows))
    config = verl_config(actor_overrides(Path(args.model), len(rows), lr=args.lr, param_dtype=args.param_dtype))
    group = ActorGroup(config, Placement(per_node=args.ray, cpu=True))
    old = compute_log_probs(group, rows, args.pad_id, args.temperature)
    metrics = update(group, rows, args.pad_id, old, args.temperature)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(args.model) / "model.safetensors", out / "weights.safetensors")
    group.write_weights(out / "weights.safetensors")
    (out / "metrics.json").write_text(json.dumps(_plain(metrics)))


def shard(rows: list[Any], rank: int, world: int) -> list[Any]:
    """This rank's contiguous share of the rows, as verl's data-parallel dispatch splits a batch (``chunk``)."""
    if len(rows) % world:
        raise ValueError(f"{len(rows)} rows do not split over {world} ranks")
    size = len(rows) // world
    return rows[rank * size:(rank + 1) * size]


def _plain(value: Any) -> Any:
    """verl's metrics (lists of floats, tensors) as JSON values."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist"):
        return value.tolist()
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m repro.verl.check", description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["advantages", "batch", "logprobs", "update"])
    parser.add_argument("--model", default="", help="a Hugging Face checkpoint folder (logprobs, update)")
    parser.add_argument("--rows", required=True, help="rows as JSON (repro.verl.batch.rows_to_json)")
    parser.add_argument("--out", required=True, help="update: a folder; the other modes: a JSON file")
    parser.add_argument("--pad-id", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--param-dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--ray", type=int, default=0, help="update: N Ray workers placed by verl (0: this process)")
    parser.add_argument("--epsilon", type=float, default=1e-6, help="advantages: GRPO's epsilon")
    args = parser.parse_args(argv)
    ensure_platform()
    modes = {"advantages": run_advantages, "batch": run_batch, "logprobs": run_logprobs, "update": run_update}
    modes[args.mode](args)


if __name__ == "__main__":
    main()

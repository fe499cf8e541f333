"""``python -m repro.verl.worker``: verl's actor kept alive in verl's environment, serving the RL loop's updates.

The package's RL loop (``trainer=verl``, :class:`repro.verl.policy.VerlPolicy`) sends one JSON command a line on
stdin; each reply is one stdout line starting with :data:`REPLY` (verl logs to stdout too). Commands:

* ``update``: a step's rows (a JSON file of :mod:`repro.verl.batch` rows), ``passes`` and ``recompute``: verl's
  log-probs of the rows first (against the recorded ones: the on-policy check; with ``recompute`` they are the old
  log-probs), then ``passes`` calls of ``update_actor`` over the trained rows as one mini-batch. repro's row weights
  and its normaliser enter through the advantages: the clipped (and dual-clipped) loss is positively homogeneous in
  the advantage, so verl's ``seq-mean-token-mean`` over rows with ``A * w * rows / normaliser`` is repro's
  ``sum(w * row mean) / normaliser``.
* ``save``: the gathered weights into a checkpoint folder (the names of its existing ``model.safetensors``);
* ``score``: log-probs of a completion after a prompt (the weight probe);
* ``servers``: the colocated vLLM replicas' URLs and served model name (placement ``ray`` on GPUs);
* ``sync``: the actor's weights into the replicas, which wake (verl's ``update_weights``); ``quit``.

The actor is verl's worker in this process (placement ``process``: the CPU path) or a Ray worker group of
``nnodes`` x ``per_node`` workers placed by verl (placement ``ray``, :mod:`repro.verl.cluster`); on GPUs the group
carries verl's vLLM replicas (hybrid engine), put to sleep before each update. A batch is padded to a multiple of
the group's size with copies of its last row at advantage 0 (verl's dispatch splits it evenly; the copies add
nothing to the loss, and the advantage scale counts them).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from repro.verl.batch import PlainRow, rows_from_json, split_row

REPLY = "@@repro-verl@@ "


def reply(payload: dict[str, Any]) -> None:
    sys.stdout.write(REPLY + json.dumps(payload) + "\n")
    sys.stdout.flush()


def padded(rows: list[PlainRow], world: int) -> list[PlainRow]:
    """``rows`` plus copies of the last at advantage 0, to a multiple of ``world`` rows."""
    fill = -len(rows) % world
    return rows + [dataclasses.replace(rows[-1], advantage=0.0) for _ in range(fill)]


def scaled(rows: list[PlainRow], normalizer: float) -> list[PlainRow]:
    """The rows with their weight and repro's normaliser folded into the advantage (see the module docstring)."""
    return [dataclasses.replace(r, advantage=r.advantage * r.weight * len(rows) / normalizer) for r in rows]


def _mismatch(rows: list[PlainRow], verl: list[list[float]]) -> dict[str, float]:
    """max and mean |verl's log-prob - the recorded one| over the sampled tokens."""
    diffs = []
    for row, mine in zip(rows, verl, strict=True):
        _, _, mask, recorded = split_row(row)
        diffs += [abs(a - b) for a, b, m in zip(mine, recorded, mask, strict=True) if m]
    return {"max": max(diffs, default=0.0), "mean": sum(diffs) / len(diffs) if diffs else 0.0}


def run_update(worker: Any, command: dict[str, Any], pad_id: int) -> dict[str, Any]:
    from repro.verl.actor import compute_log_probs, update

    started = time.perf_counter()
    rows = rows_from_json(Path(command["rows"]))
    live = [r for r in rows if r.weight > 0]
    used = [r for r in live if r.advantage != 0 or not command.get("skip_zero_advantage", True)]
    normalizer = sum(r.weight for r in live)
    stats: dict[str, Any] = {"rows": len(rows), "rows_trained": len(used), "normalizer": normalizer, "updates": [],
                             "sampled_tokens": sum(sum(r.loss_mask) for r in used)}
    if not used or normalizer <= 0:
        return {**stats, "update_skipped": True, "optimizer_steps": 0, "seconds": time.perf_counter() - started}
    replicas = getattr(worker, "replicas", None)
    if replicas is not None:
        replicas.sleep()  # vLLM's weights and KV cache leave the GPUs for the update; the sync wakes them
    batch = padded(used, getattr(worker, "world_size", 1))
    verl = compute_log_probs(worker, batch, pad_id, command.get("temperature", 1.0))
    mismatch = _mismatch(used, verl[:len(used)])
    old = verl if command.get("recompute") else [split_row(r)[3] for r in batch]
    for index in range(int(command.get("passes", 1))):
        metrics = update(worker, scaled(batch, normalizer), pad_id, old, command.get("temperature", 1.0))
        stats["updates"].append({"loss": metrics["actor/pg_loss"][0], "grad_norm": metrics["grad_norm"][0],
                                 # verl's own metric: the mean over rows of each row's clipped share (pads included)
                                 "clip_fraction": metrics["actor/pg_clipfrac"][0],
                                 "log_ratio_abs_max": mismatch["max"] if index == 0 else 0.0, "entropy": 0.0})
    return {**stats, "old_logprob_mismatch": mismatch, "optimizer_steps": len(stats["updates"]),
            "seconds": time.perf_counter() - started}


def run_save(worker: Any, command: dict[str, Any]) -> dict[str, Any]:
    target = Path(command["dir"]) / "model.safetensors"
    if hasattr(worker, "write_weights"):  # a Ray worker group: its workers gather and write
        return {"saved": str(target), "tensors": worker.write_weights(target)}
    from repro.verl.weights import write_weights

    return {"saved": str(target), "tensors": write_weights(worker, target)}


def run_score(worker: Any, command: dict[str, Any], pad_id: int) -> dict[str, Any]:
    from repro.verl.actor import compute_log_probs

    prompt, completion = list(command["prompt"]), list(command["completion"])
    row = PlainRow("probe", "probe", 0, prompt + completion, [0] * len(prompt) + [1] * len(completion),
                   [0.0] * (len(prompt) + len(completion)), 1.0, 0.0, 0.0)
    return {"logprobs": compute_log_probs(worker, padded([row], getattr(worker, "world_size", 1)), pad_id)[0]}


def run_servers(worker: Any) -> dict[str, Any]:
    replicas = getattr(worker, "replicas", None)
    if replicas is None:
        raise ValueError("this actor has no rollout replicas (placement ray on GPUs has; on CPU the rollout is "
                         "repro's CPU server)")
    return {"urls": replicas.addresses(), "served_model_name": replicas.served_model_name}


def run_sync(worker: Any, command: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    run_servers(worker)  # the same refusal without replicas
    worker.replicas.sync(int(command["step"]))
    return {"seconds": time.perf_counter() - started}


def handle(worker: Any, op: str, command: dict[str, Any], pad_id: int) -> dict[str, Any]:
    if op == "update":
        return run_update(worker, command, pad_id)
    if op == "save":
        return run_save(worker, command)
    if op == "score":
        return run_score(worker, command, pad_id)
    if op == "servers":
        return run_servers(worker)
    if op == "sync":
        return run_sync(worker, command)
    raise ValueError(f"unknown command {op!r}")


def build(settings: dict[str, Any], model: Path) -> Any:
    """verl's actor for ``settings``: one worker in this process, or a Ray worker group (``settings["placement"]``)."""
    from repro.verl.actor import actor_overrides, build_actor, verl_config

    s = settings
    extra = [f"actor_rollout_ref.actor.clip_ratio_low={s['clip_low']}",
             f"actor_rollout_ref.actor.clip_ratio_high={s['clip_high']}",
             f"actor_rollout_ref.actor.clip_ratio_c={s['clip_ratio_c'] or 1e9}",
             f"actor_rollout_ref.actor.optim.betas=[{s['betas'][0]},{s['betas'][1]}]",
             f"actor_rollout_ref.actor.optim.weight_decay={s['weight_decay']}",
             f"actor_rollout_ref.actor.optim.clip_grad={s['max_grad_norm']}",
             "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean", *s.get("systems", [])]
    config = verl_config(actor_overrides(model, 1, lr=s["lr"], param_dtype=s["param_dtype"], extra=extra))
    placement = s.get("placement") or {}
    if placement.get("kind", "process") == "process":
        return build_actor(config)
    from repro.verl.cluster import ActorGroup, Placement

    return ActorGroup(config, Placement(**{k: v for k, v in placement.items() if k != "kind"}))


def main(argv: list[str] | None = None) -> None:
    from repro.verl.check import ensure_platform

    parser = argparse.ArgumentParser(prog="python -m repro.verl.worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--settings", required=True, help="JSON: lr, clip_low, clip_high, clip_ratio_c, betas, "
                                                          "weight_decay, max_grad_norm, param_dtype, pad_id; "
                                                          "systems (verl overrides), placement")
    args = parser.parse_args(argv)
    ensure_platform()
    settings = json.loads(args.settings)
    worker = build(settings, Path(args.model))
    reply({"ready": True, "world_size": getattr(worker, "world_size", 1)})
    for line in sys.stdin:
        command = json.loads(line)
        op = command.get("op")
        if op == "quit":
            break
        try:
            reply(handle(worker, op, command, settings["pad_id"]))
        except Exception as exc:  # the loop gets the reason; the worker stays up for the next command
            reply({"error": f"{type(exc).__name__}: {exc}"})


if __name__ == "__main__":
    main()

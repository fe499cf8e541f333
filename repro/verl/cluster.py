"""verl's actor placed by Ray: ``ActorRolloutRefWorker`` as a ``RayWorkerGroup`` on a ``RayResourcePool`` (one worker a
GPU, on every node of the cluster), and on GPUs verl's vLLM replicas colocated with it (the hybrid engine: role
``actor_rollout``, :class:`Replicas`). Runs in verl's environment, in the driver process (:mod:`repro.verl.worker`);
the harnesses, sandboxes and the recording proxy stay in the package's job on the same node.

The group answers ``compute_log_prob`` and ``update_actor`` as one worker does (verl's data-parallel dispatch splits
the batch over the workers), so :mod:`repro.verl.actor` drives either. On CPU (CI) the workers are Ray processes
with the CPU platform registered by Ray's ``worker_process_setup_hook``, collectives over gloo.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.verl.env import SOURCE_ROOT


@dataclass(frozen=True)
class Placement:
    """Where the group runs: ``nnodes`` x ``per_node`` workers (GPUs; on CPU, processes) of the Ray cluster at
    ``address`` ("" starts one on this machine); ``rollout``: colocate verl's vLLM replicas (GPUs only)."""

    nnodes: int = 1
    per_node: int = 1
    address: str = ""
    rollout: bool = False
    cpu: bool = False

    @property
    def world_size(self) -> int:
        return self.nnodes * self.per_node


def runtime_env(cpu: bool) -> dict[str, Any]:
    """Ray's runtime environment for the workers: the package importable (its source first on ``PYTHONPATH``, as
    in the driver); on CPU the CPU platform registered in every worker before verl is imported there."""
    path = os.pathsep.join([str(SOURCE_ROOT), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])
    env: dict[str, Any] = {"env_vars": {"PYTHONPATH": path, "TOKENIZERS_PARALLELISM": "false"}}
    if cpu:
        from repro.verl.cpu_platform import ENV

        env["env_vars"].update(ENV)
        env["worker_process_setup_hook"] = "repro.verl.cpu_platform.register"
    return env


def start_ray(placement: Placement) -> None:
    """Join the cluster at ``placement.address``, or start a private one on this machine (CPU: enough CPUs for
    the workers; no dashboard either way)."""
    import ray

    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {"runtime_env": runtime_env(placement.cpu), "include_dashboard": False,
                              "log_to_driver": True}
    if placement.address:
        ray.init(address=placement.address, **kwargs)
    else:
        ray.init(num_cpus=placement.world_size + 1 if placement.cpu else None, **kwargs)


def _worker_class() -> type:
    """verl's ``ActorRolloutRefWorker`` plus one method: the gathered weights written as a checkpoint file."""
    from verl.single_controller.base.decorator import Dispatch, register
    from verl.workers.engine_workers import ActorRolloutRefWorker

    class ReproActorWorker(ActorRolloutRefWorker):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def write_weights(self, target: str) -> int:
            from repro.verl.weights import write_weights

            return write_weights(self, Path(target))

    return ReproActorWorker


class ActorGroup:
    """verl's actor as a Ray worker group (and, with ``placement.rollout``, its colocated vLLM replicas)."""

    def __init__(self, config: Any, placement: Placement) -> None:
        import ray
        from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

        if placement.rollout and placement.cpu:
            raise ValueError("verl's vLLM replicas need GPUs; on CPU the rollout is repro's CPU server")
        start_ray(placement)
        self.placement = placement
        self.pool = RayResourcePool([placement.per_node] * placement.nnodes, use_gpu=not placement.cpu,
                                    max_colocate_count=1)
        role = "actor_rollout" if placement.rollout else "actor"
        worker = RayClassWithInitArgs(ray.remote(_worker_class()), config=config.actor_rollout_ref, role=role)
        self.group = RayWorkerGroup(self.pool, worker, device_name="cpu" if placement.cpu else "cuda")
        self.group.init_model()
        self.replicas = Replicas(config, self.group, self.pool) if placement.rollout else None

    @property
    def world_size(self) -> int:
        return self.placement.world_size

    def compute_log_prob(self, data: Any) -> Any:
        return self.group.compute_log_prob(data)

    def update_actor(self, data: Any) -> Any:
        return self.group.update_actor(data)

    def write_weights(self, target: Path) -> int:
        return int(self.group.write_weights(str(target))[0])


class Replicas:
    """verl's vLLM servers on the actor's GPUs (one replica a ``rollout_tensor_parallel_size`` GPUs), each serving
    vLLM's OpenAI app on its node; asleep (weights and KV cache released) during the update, woken by the weight
    sync, which pushes the actor's weights over CUDA IPC in buckets of ``update_weights_bucket_megabytes``."""

    def __init__(self, config: Any, group: Any, pool: Any) -> None:
        from verl.checkpoint_engine import CheckpointEngineManager
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.rollout.llm_server import LLMServerManager

        self.servers = LLMServerManager.create(config=config, worker_group=group, rollout_resource_pool=pool)
        engine = omega_conf_to_dataclass(config.actor_rollout_ref.rollout.checkpoint_engine)
        self.checkpoints = CheckpointEngineManager(engine, group, self.servers.get_replicas())
        self.served_model_name = str(config.actor_rollout_ref.model.path)
        self.sleep()  # verl's trainer does the same at start: the actor's weights go in by the first sync
        self.sync(0)

    def addresses(self) -> list[str]:
        """Each replica's base URL (``http://ip:port``, vLLM's OpenAI routes under ``/v1``)."""
        return [f"http://{address}" for address in self.servers.get_addresses()]

    def sleep(self) -> None:
        """Release vLLM's weights and KV cache (``free_cache_engine``) for the update; calls in flight finish first."""
        self.checkpoints.sleep_replicas()

    def sync(self, step: int) -> None:
        """Push the actor's weights into every replica and wake it (verl's ``update_weights``)."""
        self.checkpoints.update_weights(step)

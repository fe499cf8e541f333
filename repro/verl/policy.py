"""The RL loop's policy update on verl's actor (``trainer=verl``): the same surface as repro's own
:class:`repro.train.rl.PolicyTrainer` (``plan``, ``update``, ``save``, ``score``, ``save_state``), served by a
:mod:`repro.verl.worker` process kept alive in verl's environment. Rows cross as JSON; the weights go to the policy
folder the model server reloads, as repro's trainer writes them. Runs in the package's environment."""

from __future__ import annotations

import atexit
import json
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from repro.common.lifecycle import Closing
from repro.train.objective import check_on_policy
from repro.verl.batch import rows_to_json
from repro.verl.config import VerlUpdateConfig
from repro.verl.env import ensure_verl_env, verl_command, verl_env_vars
from repro.verl.worker import REPLY  # the worker module imports verl only inside its functions


class VerlWorkerError(RuntimeError):
    """verl's worker failed a command or stopped."""


class VerlPolicy(Closing):
    """``PolicyTrainer``'s surface over verl's actor: one process (``trainer.placement=process``, the miniature's CPU
    path) or a Ray worker group (``ray``; on GPUs with verl's vLLM replicas colocated: :meth:`rollout_servers`,
    :meth:`sync_rollout`)."""

    def __init__(self, model_dir: Path, cfg: VerlUpdateConfig) -> None:
        self.model_dir, self.cfg, self.steps = Path(model_dir), cfg, 0
        config = json.loads((self.model_dir / "config.json").read_text())
        pad_id = config.get("pad_token_id") or 0  # padding is masked out: any id the model knows
        self.scratch = Path(tempfile.mkdtemp(prefix="repro-verl-rows-"))
        settings = {"lr": cfg.learning_rate, "clip_low": cfg.clip_low, "clip_high": cfg.clip_high,
                    "clip_ratio_c": cfg.clip_ratio_c, "betas": list(cfg.adam_betas), "weight_decay": cfg.weight_decay,
                    "max_grad_norm": cfg.max_grad_norm, "param_dtype": "bf16" if cfg.bf16 else "fp32",
                    "pad_id": pad_id, "placement": cfg.placement_settings(),
                    "systems": cfg.systems_overrides() if cfg.on_gpus else []}
        command = verl_command(ensure_verl_env(), "repro.verl.worker", "--model", str(self.model_dir),
                               "--settings", json.dumps(settings))
        self.log = (self.scratch / "worker.log").open("w")
        self.process = subprocess.Popen(command, env=verl_env_vars(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.log, text=True)
        atexit.register(self.close)
        self.world_size = int(self._read().get("world_size", 1))  # {"ready": true, ...}

    def _read(self) -> dict[str, Any]:
        for line in self.process.stdout:  # type: ignore[union-attr]
            if line.startswith(REPLY):
                answer = json.loads(line[len(REPLY):])
                if "error" in answer:
                    raise VerlWorkerError(f"verl's worker: {answer['error']} (log: {self.log.name})")
                return answer
            self.log.write(line)
        raise VerlWorkerError(f"verl's worker stopped (exit {self.process.wait()}); its log: {self.log.name}")

    def _ask(self, **command: Any) -> dict[str, Any]:
        self.process.stdin.write(json.dumps(command) + "\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]
        return self._read()

    def plan(self, rows: Sequence[Any]) -> None:
        if self.cfg.ppo_mini_batch_rows:
            raise ValueError("trainer=verl: PPO mini-batches (trainer.ppo_mini_batch_rows > 0) are not wired yet; "
                             "the rows of a step are one mini-batch, trainer.updates_per_batch passes")
        return None

    def update(self, rows: Sequence[Any], plan: Any = None) -> dict[str, Any]:
        """``updates_per_batch`` passes of verl's ``update_actor`` over the step's rows; the first checks the
        recorded log-probs against verl's (``trainer.on_policy_log_ratio_max``)."""
        path = rows_to_json(list(rows), self.scratch / f"rows_{self.steps:05d}.json")
        stats = self._ask(op="update", rows=str(path), passes=self.cfg.updates_per_batch,
                          recompute=self.cfg.old_logprobs == "recompute",
                          skip_zero_advantage=self.cfg.skip_zero_advantage)
        path.unlink()
        if stats["updates"]:
            check_on_policy(stats["old_logprob_mismatch"]["max"], self.cfg.on_policy_log_ratio_max)
        self.steps += 1
        return {**stats, "engine": "verl"}

    def save(self, out_dir: Path) -> Path:
        """The gathered weights into ``out_dir`` (the policy folder the server reloads: config and tokenizer stay)."""
        if Path(out_dir).resolve() != self.model_dir.resolve():
            raise ValueError(f"trainer=verl saves into the policy folder it was built on ({self.model_dir})")
        self._ask(op="save", dir=str(out_dir))
        return Path(out_dir)

    def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        return list(self._ask(op="score", prompt=list(prompt_ids), completion=list(completion_ids))["logprobs"])

    def rollout_servers(self) -> tuple[list[str], str]:
        """The colocated vLLM replicas' base URLs and the model name they serve (GPUs only)."""
        answer = self._ask(op="servers")
        return list(answer["urls"]), str(answer["served_model_name"])

    def sync_rollout(self) -> float:
        """Push the actor's weights into the replicas (CUDA IPC) and wake them; the seconds it took."""
        return float(self._ask(op="sync", step=self.steps)["seconds"])

    def save_state(self, path: Path) -> Path:
        """The step count only: verl's optimizer state stays in the worker (resuming a trainer=verl run restarts
        the optimizer: said in the file)."""
        Path(path).write_text(json.dumps({"steps": self.steps, "optimizer": "not saved (trainer=verl)"}))
        return Path(path)

    def load_state(self, path: Path) -> None:
        raise SystemExit("error: trainer=verl cannot resume a run yet (the optimizer state lives in verl's worker); "
                         "start the run again in a new folder")

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.write('{"op": "quit"}\n')  # type: ignore[union-attr]
                self.process.stdin.close()  # type: ignore[union-attr]
                self.process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                self.process.kill()
        self.log.close()
        if self.process.poll() == 0:  # a clean exit: its rows and log are of no further use (else kept for the error)
            shutil.rmtree(self.scratch, ignore_errors=True)

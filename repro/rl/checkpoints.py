"""Where an RL run keeps its state, and how it resumes: the policy folder the server loads after every step, the
optimizer state, each finished step's record, and (``checkpoint_every`` > 1) a copy of both every N steps.

Layout under the run (or arm) folder: ``policy/`` (weights + ``rl_step.json``), ``rl/trainer_state.pt``,
``rl/step_NNN/step_record.json``, ``rl/diagnostics.jsonl``, ``rl/checkpoint/`` (weights + state of the last
resumable step when ``checkpoint_every`` > 1).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

TRAINER_STATE = "trainer_state.pt"
STEP_RECORD = "step_record.json"
POLICY_STEP = "rl_step.json"  # in the policy checkpoint: the RL step whose update its weights hold
DIAGNOSTICS_FILE = "rl/diagnostics.jsonl"  # one JSON line per finished RL step (step_diagnostics), whatever the tracker
CHECKPOINT = "checkpoint"  # rl/checkpoint/: weights + trainer state of the last resumable step (checkpoint_every > 1)


def stage_policy(start_dir: Path, run_dir: Path) -> Path:
    """``run_dir/policy``: a private copy of the starting checkpoint that RL overwrites step by step (the source
    stays intact); an interrupted run's copy (a step finished: ``rl/trainer_state.pt`` beside it) is kept and RL
    resumes from it; with ``checkpoint_every`` > 1 the policy comes back from the last checkpoint."""
    policy = Path(run_dir) / "policy"
    if (Path(run_dir) / "rl" / TRAINER_STATE).exists() and (policy / "config.json").exists():
        return policy
    checkpoint = Path(run_dir) / "rl" / CHECKPOINT
    source = checkpoint if (checkpoint / TRAINER_STATE).exists() else start_dir
    shutil.rmtree(policy, ignore_errors=True)
    shutil.copytree(source, policy, ignore=shutil.ignore_patterns("warm_start.json", TRAINER_STATE))
    return policy


class RunState:
    """The RL state of one run folder: which steps finished, where the optimizer state is, how to checkpoint."""

    def __init__(self, run_dir: Path, policy_dir: Path, steps: int, checkpoint_every: int) -> None:
        self.run_dir, self.policy_dir = Path(run_dir), Path(policy_dir)
        self.steps, self.every = steps, checkpoint_every

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "rl" / CHECKPOINT

    @property
    def state_path(self) -> Path:
        if self.every > 1:
            return self.checkpoint_dir / TRAINER_STATE
        return self.run_dir / "rl" / TRAINER_STATE

    def step_dir(self, step: int) -> Path:
        return self.run_dir / "rl" / f"step_{step:03d}"

    def rewind(self) -> None:
        """Steps after the last checkpoint (all of them without one) are dropped: the weights that sampled their
        rollouts are gone; the policy came back from the checkpoint (or the start)."""
        marker = self.checkpoint_dir / POLICY_STEP
        kept = json.loads(marker.read_text())["step"] if marker.exists() else -1
        for step_dir in sorted((self.run_dir / "rl").glob("step_*")):
            if int(step_dir.name.split("_")[1]) > kept:
                shutil.rmtree(step_dir)

    def save(self, step: int, trainer: Any) -> None:
        """Make ``step`` resumable: the trainer state (every step with ``checkpoint_every`` 1, beside the weights
        saved for the server), or every ``checkpoint_every`` steps and at the end a copy of weights + state."""
        if self.every <= 1:
            trainer.save_state(self.state_path)
            return
        if (step + 1) % self.every and step + 1 != self.steps:
            return
        tmp = self.checkpoint_dir.with_name(CHECKPOINT + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(self.policy_dir, tmp)
        trainer.save_state(tmp / TRAINER_STATE)
        shutil.rmtree(self.checkpoint_dir, ignore_errors=True)
        tmp.rename(self.checkpoint_dir)

    def completed_steps(self) -> list[dict[str, Any]]:
        """The records of the steps a previous, interrupted run of this folder finished (its weights are the
        policy's checkpoint and its optimizer state ``state_path``, both written after each step)."""
        if self.every > 1 and (self.run_dir / "rl").exists():
            self.rewind()
        if not self.state_path.exists():
            return []
        records = []
        for step in range(self.steps):
            path = self.step_dir(step) / STEP_RECORD
            if not path.exists():
                break
            records.append(json.loads(path.read_text()))
        marker = self.policy_dir / POLICY_STEP
        weights_step = json.loads(marker.read_text())["step"] if marker.exists() else -1
        if records and weights_step != len(records) - 1:
            raise SystemExit(f"cannot resume RL in {self.run_dir}: the policy's weights are from step "
                             f"{weights_step + 1} but the last finished step is {len(records)} (the run stopped "
                             "while saving); remove "
                             f"{self.run_dir / 'rl'} and {self.policy_dir} to restart this arm's RL")
        return records

    def mark_weights(self, step: int) -> None:
        """The policy folder now holds ``step``'s update."""
        (self.policy_dir / POLICY_STEP).write_text(json.dumps({"step": step}))

    def rewrite_diagnostics(self, history: list[dict[str, Any]]) -> None:
        """One diagnostics line per finished step (a step killed after its line was written is run again)."""
        path = self.run_dir / DIAGNOSTICS_FILE
        if history or path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(h["diagnostics"]) + "\n" for h in history))

    def append_diagnostics(self, record: dict[str, Any]) -> None:
        """Append a finished step's diagnostics line."""
        (self.run_dir / "rl").mkdir(parents=True, exist_ok=True)
        with (self.run_dir / DIAGNOSTICS_FILE).open("a") as out:
            out.write(json.dumps(record["diagnostics"]) + "\n")

    def write_step(self, step: int, record: dict[str, Any]) -> None:
        """The step's record, written last (after :meth:`save`): from here on the step counts as finished."""
        self.step_dir(step).mkdir(parents=True, exist_ok=True)
        (self.step_dir(step) / STEP_RECORD).write_text(json.dumps(record, default=str))

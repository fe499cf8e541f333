"""``trainer=verl`` in the RL loop: :class:`repro.verl.policy.VerlPolicy` drives verl's actor in a worker process
with repro's rows. Held to repro's own trainer: one update on the same rows gives the same loss and the same
gradient norm (repro's row weights and normaliser folded into verl's advantages); the weights it
saves are what the server loads, and its scores are transformers' on them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from repro.cli.commands import main as repro_main
from repro.train.config import UpdateConfig
from repro.train.objective import token_logprobs
from repro.train.rl import PolicyTrainer
from repro.verl.config import VerlUpdateConfig
from repro.verl.policy import VerlPolicy
from tests.support import recorded_rows

COMMON = {"learning_rate": 1e-3, "updates_per_batch": 1, "on_policy_log_ratio_max": 0.0, "micro_batch_rows": 64}
CPU = {"device": "cpu", "bf16": False, "gradient_checkpointing": False, "n_gpus_per_node": 1,
       "ulysses_sequence_parallel_size": 1}


@pytest.fixture
def two_copies(tmp_path: Path) -> tuple[Path, Path]:
    model = tmp_path / "tiny"
    assert repro_main(["build-model", "--out", str(model), "--seed", "0"]) in (0, None)
    shutil.copytree(model, tmp_path / "copy")
    return model, tmp_path / "copy"


@pytest.mark.parametrize("placement", [{"placement": "process"},
                                       {"placement": "ray", "n_gpus_per_node": 2}], ids=["process", "ray-2-workers"])
def test_verls_update_is_repros_update(verl_python: Path, two_copies: tuple[Path, Path], placement: dict) -> None:
    """In one process, and as a Ray worker group of 2 (the GPU path's placement) on an odd number of rows: the
    batch padded to the group's size adds nothing to the update."""
    ours_dir, verl_dir = two_copies
    rows = recorded_rows(vocab=600)[:-1]  # recorded logprobs are not this model's: the ratio clips, weights count
    assert len(rows) % 2 == 1
    ours = PolicyTrainer(ours_dir, UpdateConfig(**COMMON)).update(rows)["updates"][0]
    policy = VerlPolicy(verl_dir, VerlUpdateConfig(**COMMON, **{**CPU, **placement}))
    try:
        assert policy.world_size == placement.get("n_gpus_per_node", 1)
        stats = policy.update(rows)
        theirs = stats["updates"][0]
        assert stats["rows_trained"] == len(rows) and stats["optimizer_steps"] == 1
        assert theirs["loss"] == pytest.approx(ours["loss"], rel=1e-5)
        assert theirs["grad_norm"] == pytest.approx(ours["grad_norm"], rel=1e-4)
        # verl's clip fraction is its own metric (the mean over rows of each row's clipped share, pads included),
        # repro's the share of clipped tokens: both count clipping, neither is the other
        assert 0.0 < theirs["clip_fraction"] < 1.0 and 0.0 < ours["clip_fraction"] < 1.0
        assert policy.save(verl_dir) == verl_dir
        row = rows[0]
        first = row.loss_mask.index(1)
        served = AutoModelForCausalLM.from_pretrained(verl_dir, dtype=torch.float32)
        ids = torch.tensor([row.input_ids])
        expected = token_logprobs(served, ids, torch.ones_like(ids))[0, first:].tolist()
        assert policy.score(row.input_ids[:first], row.input_ids[first:]) == pytest.approx(expected, abs=1e-6)
        start = AutoModelForCausalLM.from_pretrained(ours_dir.parent / "tiny", dtype=torch.float32)
        assert not torch.equal(start.lm_head.weight, served.lm_head.weight)  # the saved weights moved
    finally:
        policy.close()

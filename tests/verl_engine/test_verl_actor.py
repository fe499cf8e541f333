"""verl's real actor on repro's rows, on CPU: ``ActorRolloutRefWorker`` from verl's own ``ppo_trainer`` config
(FSDP2, remove-padding, sdpa), through verl's own padding -> no-padding conversion. Held to repro's own trainer:
the batch verl reads is repro's rows, token for token; verl's ``compute_log_prob`` equals repro's log-probs of the
same rows; one ``update_actor`` sharded over 2 gloo processes gives the weights of the same step in one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from repro.cli.commands import main as repro_main
from repro.train.objective import pad_rows, token_logprobs
from repro.verl.batch import rows_to_json
from tests.support import recorded_rows
from tests.verl_engine.conftest import run_check


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("verl") / "tiny"
    assert repro_main(["build-model", "--out", str(out), "--seed", "0"]) in (0, None)
    return out


@pytest.fixture(scope="module")
def rows(model_dir: Path) -> list:
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    return recorded_rows(vocab=vocab)


@pytest.fixture(scope="module")
def rows_file(rows: list, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return rows_to_json(rows, tmp_path_factory.mktemp("rows") / "rows.json")


def test_the_batch_verls_actor_reads_is_repros_rows(verl_python: Path, rows: list, rows_file: Path,
                                                    model_dir: Path, tmp_path: Path) -> None:
    run_check(verl_python, ["batch", "--model", str(model_dir), "--rows", str(rows_file),
                            "--out", str(tmp_path / "batch.json")])
    batch = json.loads((tmp_path / "batch.json").read_text())
    assert len(batch) == len(rows)
    for row, seen in zip(rows, batch, strict=True):
        first = row.loss_mask.index(1)
        assert seen["input_ids"] == row.input_ids  # verl's no-padding sequence: the row, token for token
        assert seen["responses"] == row.input_ids[first:]
        assert seen["response_mask"] == row.loss_mask[first:]
        sampled = [lp for lp, m in zip(row.old_logprobs[first:], row.loss_mask[first:], strict=True) if m]
        assert [lp for lp, m in zip(seen["rollout_log_probs"], seen["response_mask"], strict=True) if m] == \
            pytest.approx(sampled)
        assert seen["uid"] == row.group_id


def test_verls_rollout_level_grpo_advantage_equals_repros(verl_python: Path, tmp_path: Path) -> None:
    """The recipe's advantage (group std with ddof 1, epsilon 1e-6, one advantage per rollout) from verl's own
    ``compute_grpo_outcome_advantage`` equals the one repro's rows carry, though a rollout has two rows."""
    rows = recorded_rows(vocab=500, std_ddof=1, eps=1e-6)
    assert len(rows) > len({r.rollout_id for r in rows})  # several rows a rollout: per-row GRPO would differ
    rows_file = rows_to_json(rows, tmp_path / "rows.json")
    run_check(verl_python, ["advantages", "--rows", str(rows_file), "--out", str(tmp_path / "adv.json")])
    verl = json.loads((tmp_path / "adv.json").read_text())
    assert {r.rollout_id: verl[r.rollout_id] for r in rows} == pytest.approx({r.rollout_id: r.advantage for r in rows},
                                                                             abs=1e-6)
    assert min(abs(v) for v in verl.values()) > 0.5  # mixed groups: no advantage is 0, the equality is not vacuous


def test_verls_compute_log_prob_equals_repros_trainer(verl_python: Path, rows: list, rows_file: Path,
                                                      model_dir: Path, tmp_path: Path) -> None:
    run_check(verl_python, ["logprobs", "--model", str(model_dir), "--rows", str(rows_file),
                            "--out", str(tmp_path / "logprobs.json")])
    verl = json.loads((tmp_path / "logprobs.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    batch = pad_rows(rows, pad_id=0)
    with torch.no_grad():
        ours = token_logprobs(model, batch["input_ids"], batch["attention_mask"])
    worst = 0.0
    for i, row in enumerate(rows):
        first = row.loss_mask.index(1)
        mine = ours[i, first:len(row.input_ids)].tolist()
        assert len(verl[i]) == len(mine)
        worst = max(worst, *(abs(a - b) for a, b in zip(verl[i], mine, strict=True)))
    assert worst < 1e-5, worst


UPDATE = ["update", "--lr", "1e-3"]


@pytest.fixture(scope="module")
def one_process_step(verl_python: Path, rows_file: Path, model_dir: Path,
                     tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same update in one process (the reference both placements are held to)."""
    out = tmp_path_factory.mktemp("one")
    run_check(verl_python, [*UPDATE, "--model", str(model_dir), "--rows", str(rows_file), "--out", str(out)])
    return out


def _assert_same_step(model_dir: Path, one: Path, other: Path) -> None:
    start = load_file(str(model_dir / "model.safetensors"))
    first, second = load_file(str(one / "weights.safetensors")), load_file(str(other / "weights.safetensors"))
    assert set(start) <= set(first) and set(start) <= set(second)
    step_one = torch.cat([(first[k] - start[k]).flatten() for k in sorted(start)])
    step_two = torch.cat([(second[k] - start[k]).flatten() for k in sorted(start)])
    assert step_one.abs().max() > 1e-4  # the control: the step changed the weights, so the equality is not vacuous
    # AdamW's first step is lr * g / (|g| + eps) per element: where a gradient is near 0, the order of gloo's
    # reduction decides the sign of a tiny g, so elements may differ by up to lr; the step as a whole may not
    relative = float((step_one - step_two).norm() / step_one.norm())
    assert relative < 1e-3, relative
    m1 = json.loads((one / "metrics.json").read_text())
    m2 = json.loads((other / "metrics.json").read_text())
    assert len(m1["grad_norm"]) == len(m2["grad_norm"]) == 1  # one optimizer step in both
    assert m2["actor/pg_loss"][0] == pytest.approx(m1["actor/pg_loss"][0], rel=1e-5, abs=1e-7)
    assert m2["grad_norm"][0] == pytest.approx(m1["grad_norm"][0], rel=1e-5)


def test_one_update_in_two_gloo_processes_equals_the_same_update_in_one(verl_python: Path, rows_file: Path,
                                                                        model_dir: Path, one_process_step: Path,
                                                                        tmp_path: Path) -> None:
    run_check(verl_python, [*UPDATE, "--model", str(model_dir), "--rows", str(rows_file), "--out", str(tmp_path)],
              nproc=2)
    _assert_same_step(model_dir, one_process_step, tmp_path)


def test_one_update_by_two_ray_workers_equals_the_same_update_in_one(verl_python: Path, rows_file: Path,
                                                                     model_dir: Path, one_process_step: Path,
                                                                     tmp_path: Path) -> None:
    """verl's placement: a ``RayWorkerGroup`` of 2 actor workers driven from one process (the GPU path's driver),
    the batch split by verl's dispatch, the weights gathered and written by the workers."""
    run_check(verl_python, [*UPDATE, "--model", str(model_dir), "--rows", str(rows_file), "--out", str(tmp_path),
                            "--ray", "2"])
    _assert_same_step(model_dir, one_process_step, tmp_path)

"""The full-scale job plans per-GPU memory from the checkpoint's config.json and its trainer settings before it
loads anything, and refuses a layout that cannot fit with the numbers: repro's own single-process trainer and verl on
one GPU are refused, verl on 8 x H100, 2 x 8 x H100 and 4 x B200 fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra.utils import instantiate

from repro.cli.runner import compose_config
from repro.recipe.memory_gate import memory_gate, model_shape
from repro.verl.config import VerlUpdateConfig
from repro.verl.memory_plan import QWEN35_9B
from tests.support import repro_cli


@pytest.fixture
def qwen35(tmp_path: Path) -> Path:
    """A checkpoint folder as Qwen3.5-9B's would look to the planner: its config.json (the decoder under
    ``text_config``) and the safetensors index whose total size gives the parameter count."""
    text = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4,
            "head_dim": 256, "intermediate_size": 12288, "vocab_size": 248320, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": text}))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": QWEN35_9B.params * 2}, "weight_map": {}}))
    return tmp_path


def _composed(*overrides: str) -> tuple:
    cfg = compose_config(["experiment=agl_swebench_qwen35_9b", *overrides])
    return instantiate(cfg.trainer), instantiate(cfg.serving)


def test_the_checkpoint_gives_the_shape_and_the_count(qwen35: Path) -> None:
    shape = model_shape(qwen35)
    assert (shape.hidden_size, shape.num_layers, shape.vocab_size, shape.params) == (4096, 32, 248320,
                                                                                     QWEN35_9B.params)


def test_verl_layouts_of_the_recipe_fit_and_print_their_plan(qwen35: Path, capsys: pytest.CaptureFixture) -> None:
    assert isinstance(_composed()[0], VerlUpdateConfig)  # the recipe runs on verl by default
    update, serving = _composed("trainer=verl")
    assert isinstance(update, VerlUpdateConfig) and update.learning_rate == 1e-6  # the recipe's settings kept
    plan = memory_gate(update, serving, str(qwen35))
    assert plan is not None and plan.fits and plan.layout.world == 8
    assert "peak" in capsys.readouterr().out
    for layout in ("b200_x4", "h100_x8_x2"):
        update, serving = _composed("trainer=verl", f"trainer.memory_layout={layout}")
        assert memory_gate(update, serving, str(qwen35)).fits


ONE_GPU = ("trainer=verl", "trainer.n_gpus_per_node=1", "trainer.ulysses_sequence_parallel_size=1")


@pytest.mark.parametrize("overrides, named", [(("trainer=grpo",), "one process"), (ONE_GPU, "trainer=verl")])
def test_the_single_process_trainer_and_one_gpu_are_refused_with_the_numbers(qwen35: Path, overrides: tuple,
                                                                             named: str) -> None:
    update, serving = _composed(*overrides)
    with pytest.raises(SystemExit) as refused:
        memory_gate(update, serving, str(qwen35))
    message = str(refused.value)
    assert "does not fit" in message and named in message and "GiB" in message and "Change:" in message


def test_an_impossible_layout_is_a_clear_error(qwen35: Path) -> None:
    update, serving = _composed("trainer=verl", "trainer.n_gpus_per_node=1")  # sp 2 over one GPU
    with pytest.raises(SystemExit, match="ulysses_sp must divide the world"):
        memory_gate(update, serving, str(qwen35))


def test_nothing_is_planned_for_a_trainer_on_the_cpu(qwen35: Path) -> None:
    update, serving = instantiate(compose_config(["experiment=rl_run"]).trainer), None
    assert memory_gate(update, serving, str(qwen35)) is None


def test_the_job_refuses_before_it_loads_any_task(qwen35: Path, tmp_path: Path) -> None:
    """The task files do not exist: a job that got past the plan would fail on them, not on memory."""
    common = ["run", "experiment=agl_swebench_qwen35_9b", f"eval.checkpoint={qwen35}", f"run.output_root={tmp_path}",
              "train_tasks.source=missing.jsonl", "val_tasks.source=missing.jsonl"]
    own = repro_cli(*common, "trainer=grpo", cwd=Path(__file__).parents[2], timeout=300)
    assert own.returncode != 0 and "does not fit" in own.stderr + own.stdout and "missing.jsonl" not in own.stderr
    verl = repro_cli(*common, cwd=Path(__file__).parents[2], timeout=300)  # the recipe's default: trainer=verl
    assert verl.returncode != 0 and "peak 73.7 GiB (rollout) of 79.6 GiB: fits" in verl.stdout
    assert "missing.jsonl" not in verl.stderr


def test_verl_on_gpus_refuses_what_its_colocated_replicas_cannot_do(tmp_path: Path) -> None:
    """Before anything starts: no checkpoint to train, or one-step-off sampling from replicas that sleep through
    the update; the CPU path (trainer=verl_cpu) starts nothing here (its server starts with the stack)."""
    from repro.experiments.rl_run import start_verl_on_gpus
    from repro.rl.evaluator import EvalConfig

    gpus = VerlUpdateConfig(device="cuda")
    with pytest.raises(SystemExit, match="one_step_off"):
        start_verl_on_gpus(gpus, EvalConfig(checkpoint=str(tmp_path)), tmp_path, "one_step_off")
    with pytest.raises(SystemExit, match=r"eval\.checkpoint"):
        start_verl_on_gpus(gpus, EvalConfig(checkpoint=""), tmp_path)
    assert start_verl_on_gpus(VerlUpdateConfig(device="cpu"), EvalConfig(checkpoint=""), tmp_path) is None
    assert not (tmp_path / "policy").exists()  # nothing staged by a refusal

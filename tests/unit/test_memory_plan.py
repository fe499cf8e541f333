"""The per-GPU memory planner (repro.verl.memory_plan): its arithmetic against hand-computed values, the named
layouts that
must fit and the two that must be refused (with the peak and a setting to change), and `repro plan --memory`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from repro.cli.commands import main
from repro.verl.memory_plan import (
    GIB,
    LAYOUTS,
    QWEN35_9B,
    Layout,
    MemoryPlanError,
    ModelShape,
    activation_bytes,
    format_plan,
    logit_bytes,
    plan_memory,
    refuse_if_not_fits,
    trainer_states,
)

TOY = ModelShape("toy-1b", hidden_size=2048, num_layers=16, num_heads=16, num_kv_heads=8, head_dim=128,
                 intermediate_size=5632, vocab_size=32000, n_params=1_000_000_000)
N = 1_000_000_000


def test_trainer_states_are_sharded_over_the_world() -> None:
    """bf16 params 2 bytes, fp32 master 4, fp32 grads 4, AdamW 2 x 4 bytes a parameter, each over the 8 GPUs."""
    layout = Layout("toy", gpu_gib=80.0, gpus_per_node=4, nodes=2)
    assert layout.world == 8
    assert trainer_states(TOY, layout) == {"params (bf16)": N * 2 / 8, "master params (fp32)": N * 4 / 8,
                                           "grads": N * 4 / 8, "AdamW moments": N * 8 / 8}
    assert sum(trainer_states(TOY, replace(layout, fsdp=False)).values()) == N * 18  # unsharded: all on each GPU
    fp32 = trainer_states(TOY, replace(layout, compute_bytes=4, fsdp=False))  # fp32 full fine-tune: no 2nd copy
    assert fp32 == {"params (fp32)": N * 4, "master params (fp32)": 0, "grads": N * 4, "AdamW moments": N * 8}


def test_the_parameter_formula_and_config_reading() -> None:
    """A tiny decoder counted by hand: embeddings 10x8 twice; a layer q 8x8, k and v 8x4 each, o 8x8, MLP 3x8x16,
    two norms of 8; a final norm of 8."""
    config = {"model_type": "vlm", "tie_word_embeddings": False, "vision_config": {"hidden_size": 99},
              "text_config": {"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
                              "num_key_value_heads": 1, "intermediate_size": 16, "vocab_size": 10}}
    shape = ModelShape.from_hf_config(config, name="tiny")
    assert (shape.hidden_size, shape.num_heads, shape.num_kv_heads, shape.head_dim) == (8, 2, 1, 4)  # d = h / H
    layer = 8 * 8 + 2 * 8 * 4 + 8 * 8 + 3 * 8 * 16 + 2 * 8
    assert shape.params == shape.formula_params() == 10 * 8 * 2 + 2 * layer + 8 == 1352
    flat = ModelShape.from_hf_config({**config["text_config"], "tie_word_embeddings": True, "head_dim": 6})
    assert flat.tie_word_embeddings and flat.head_dim == 6
    assert replace(shape, tie_word_embeddings=True).params == 1352 - 80
    assert replace(shape, n_params=5000).params == 5000  # an explicit count wins (hybrids)


def test_qwen35_9b_shape_and_the_formula_it_misses() -> None:
    config = {"model_type": "qwen3_5", "tie_word_embeddings": False, "text_config": {
        "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4,
        "head_dim": 256, "intermediate_size": 12288, "vocab_size": 248320, "tie_word_embeddings": False}}
    assert ModelShape.from_hf_config(config, "Qwen3.5-9B", n_params=QWEN35_9B.n_params) == QWEN35_9B
    assert QWEN35_9B.params == 8_953_803_264
    assert round(QWEN35_9B.formula_params() / 1e9, 2) == 8.21  # the GQA + SwiGLU formula misses the hybrid layers


def test_activations_and_logits_by_hand() -> None:
    """A 4,096-token row over sp 2: 2,048 tokens a GPU. w = 2h + 2Hd + 2Kd + 4I values a token and layer."""
    w = 2 * 2048 + 2 * 16 * 128 + 2 * 8 * 128 + 4 * 5632
    layout = Layout("toy", gpu_gib=80.0, gpus_per_node=2, ulysses_sp=2, micro_batch_tokens=4096)
    assert activation_bytes(TOY, layout) == 2048 * 2048 * 2 * 16 + 2 * 2048 * w * 2
    assert activation_bytes(TOY, replace(layout, gradient_checkpointing=False)) == 2048 * w * 2 * 17
    assert logit_bytes(TOY, layout) == 2 * 512 * 32000 * 4  # a 512-token chunk: fp32 logits and log-softmax
    assert logit_bytes(TOY, replace(layout, logprob_chunk=None)) == 2 * 2048 * 32000 * 4  # the GPU's whole share
    with pytest.raises(ValueError, match="ulysses_sp"):
        Layout("bad", gpu_gib=80.0, gpus_per_node=2, ulysses_sp=4)


def test_full_logits_of_a_64k_row_exceed_an_h100_and_chunks_do_not() -> None:
    row = Layout("row", gpu_gib=80.0, gpus_per_node=1, micro_batch_tokens=65_536)
    assert logit_bytes(QWEN35_9B, replace(row, logprob_chunk=None)) == 2 * 65_536 * 248_320 * 4 > 80e9
    assert logit_bytes(QWEN35_9B, row) == 2 * 512 * 248_320 * 4 < 2 * GIB


def test_phases_follow_offload_and_sleep() -> None:
    layout = Layout("toy", gpu_gib=80.0, gpus_per_node=4, micro_batch_tokens=8192, context_gib=1.0,
                    fragmentation=0.1)
    plan = plan_memory(TOY, layout)
    update, rollout = plan.phases["update"], plan.phases["rollout"]
    assert update["AdamW moments"] == N * 8 / 4 and update["vLLM (asleep)"] == 2.0 * GIB  # reloaded for the update
    assert update["gathered FSDP units"] == 4 * TOY.layer_params * 2
    assert update["reserve"] == rollout["reserve"] == (1.0 + 0.1 * 80) * GIB
    assert rollout["vLLM (awake)"] == 0.8 * 80 * GIB and rollout["weight-sync bucket"] == 4 * GIB
    assert all(rollout[k] == 0 for k in ("params (bf16)", "master params (fp32)", "grads", "AdamW moments"))
    assert plan.peak_phase == "rollout" and plan.peak_bytes == sum(rollout.values()) and plan.fits
    kept = plan_memory(TOY, replace(layout, param_offload=False)).phases["rollout"]
    assert kept["params (bf16)"] == N * 2 / 4 and kept["master params (fp32)"] == N * 4 / 4
    assert kept["AdamW moments"] == 0 and kept["grads"] == 0
    awake = plan_memory(TOY, replace(layout, vllm_sleeps=False)).phases["update"]
    assert awake["vLLM (awake)"] == 0.8 * 80 * GIB
    on_cpu = plan_memory(TOY, replace(layout, offload_policy=True))
    assert sum(on_cpu.phases["update"][k] for k in trainer_states(TOY, layout)) == 0
    # host RAM: the larger phase, per GPU x 4 GPUs: update keeps all states and vLLM's bf16 weights on CPU
    assert on_cpu.host_bytes_per_node == 4 * (N * 18 / 4 + N * 2)


@pytest.mark.parametrize("name", ["b200_x4", "h100_x8", "h100_x8_x2"])
def test_the_recipe_layouts_fit_qwen35_9b(name: str) -> None:
    plan = plan_memory(QWEN35_9B, LAYOUTS[name])
    assert plan.fits, format_plan(plan)
    refuse_if_not_fits(plan)  # no error
    assert "fits" in format_plan(plan) and "DOES NOT FIT" not in format_plan(plan)


def test_b200_x4_fits_at_nvidias_180_gb_too() -> None:
    assert plan_memory(QWEN35_9B, replace(LAYOUTS["b200_x4"], gpu_gib=180e9 / GIB)).fits


@pytest.mark.parametrize(("name", "setting"), [
    ("single_process_gpu0", "free_cache_engine=true"),
    ("single_process_gpu0", "use_fused_kernels=true"),
    ("single_process_gpu0", "bf16 compute params"),
    ("one_gpu_verl", "more GPUs"),
    ("one_gpu_verl", "offload_policy=true"),
    ("one_gpu_verl", "ulysses_sequence_parallel_size"),
])
def test_the_old_path_and_one_gpu_verl_are_refused(name: str, setting: str) -> None:
    plan = plan_memory(QWEN35_9B, LAYOUTS[name])
    assert not plan.fits and plan.peak_phase == "update"
    with pytest.raises(MemoryPlanError) as caught:
        refuse_if_not_fits(plan)
    message = str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert f"peak {plan.peak_bytes / GIB:.1f} GiB" in message and f"{plan.layout.gpu_gib:.1f} GiB" in message
    assert setting in message, message


def test_the_old_path_holds_16_bytes_a_parameter_beside_an_awake_vllm() -> None:
    update = plan_memory(QWEN35_9B, LAYOUTS["single_process_gpu0"]).phases["update"]
    states = update["params (fp32)"] + update["master params (fp32)"] + update["grads"] + update["AdamW moments"]
    assert states == QWEN35_9B.params * 16 and states > 143e9  # ~144 GB for 9B
    assert update["vLLM (awake)"] == 0.85 * LAYOUTS["single_process_gpu0"].gpu_gib * GIB
    assert update["logits"] == 2 * 81_920 * 248_320 * 4


def test_repro_plan_memory_prints_and_exits_1_on_a_refusal(capsys) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["plan", "--memory", "b200_x4,single_process_gpu0"])
    assert caught.value.code == 1
    captured = capsys.readouterr()
    assert "Memory plan: Qwen3.5-9B" in captured.out and "on b200_x4" in captured.out
    assert "peak 158.2 GiB (rollout) of 179.0 GiB: fits" in captured.out
    assert "on single_process_gpu0" in captured.out and "DOES NOT FIT" in captured.out
    assert "refused: Qwen3.5-9B on layout single_process_gpu0 does not fit: peak 529.3 GiB" in captured.err


def test_repro_plan_memory_that_fits_and_a_model_config(capsys, tmp_path: Path) -> None:
    main(["plan", "--memory", "h100_x8", "--memory", "h100_x8_x2"])  # no exit: both fit
    out = capsys.readouterr().out
    assert "on h100_x8:" in out and "on h100_x8_x2:" in out and "DOES NOT FIT" not in out
    folder = tmp_path / "toy-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
                                                    "intermediate_size": 16, "vocab_size": 10}))
    main(["plan", "--memory", "b200_x4", "--model-config", str(folder / "config.json")])
    assert "Memory plan: toy-model (0.00B params) on b200_x4" in capsys.readouterr().out


def test_throughput_arguments_stay_required_without_memory_only(capsys) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["plan", "experiment=mini_repro", "--gpus", "2"])
    assert caught.value.code == 2 and "--gpu-type" in capsys.readouterr().err
    with pytest.raises(SystemExit) as caught:  # --memory with some throughput arguments: all of them are needed
        main(["plan", "experiment=mini_repro", "--memory", "b200_x4", "--gpus", "2"])
    assert caught.value.code == 2
    with pytest.raises(SystemExit, match="unknown memory layout 'nope'"):
        main(["plan", "--memory", "nope"])

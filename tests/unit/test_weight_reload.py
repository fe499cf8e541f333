"""POST /v1/load_weights: a checkpoint with the same tokenizer and architecture is swapped in between batches;
anything else is a 400 that changes nothing."""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from repro.common.net import free_port
from repro.serving.cpu_server import ServerConfig, create_app
from repro.serving.engine import Engine, EngineConfig, SamplingParams
from repro.testing import ServerThread
from repro.tinymodel.model import TinyModelConfig, build_tiny_model

BASE = TinyModelConfig(vocab_size=400, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                       intermediate_size=64)
MESSAGES = [{"role": "user", "content": "Fix the bug in calc.py please."}]


def variant(root: Path, name: str, **changes: object) -> Path:
    return build_tiny_model(root / name, TinyModelConfig(**{**BASE.__dict__, **changes}), [])


def trained(source: Path, out: Path, seed: int) -> Path:
    """``source`` with new weights, saved the way a trainer saves an update (random init greedily repeats the
    last prompt token whatever the seed, so the weights are redrawn at a larger scale)."""
    shutil.copytree(source, out)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("reload")
    a = trained(variant(root, "init"), root / "a", seed=1)
    return {"a": a, "b": trained(a, root / "b", seed=2), "vocab": variant(root, "vocab", vocab_size=380),
            "wide": variant(root, "wide", intermediate_size=96)}


@pytest.fixture
def server(models: dict[str, Path]) -> Iterator[str]:
    app = create_app(ServerConfig(EngineConfig(models["a"]), served_model_name="tiny"))
    with ServerThread(app, free_port()) as running:
        yield running.url


def greedy(url: str) -> tuple[list[int], list[int]]:
    body = {"model": "tiny", "messages": MESSAGES, "temperature": 0, "max_tokens": 12, "return_token_ids": True}
    out = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
    return out["prompt_token_ids"], out["choices"][0]["token_ids"]


def transformers_greedy(model_dir: Path, prompt: list[int], n: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, attention_mask=None)
    return out[0, len(prompt):].tolist()


def load(url: str, body: object) -> httpx.Response:
    return httpx.post(f"{url}/v1/load_weights", json=body, timeout=60)


def test_reload_serves_the_new_weights(server: str, models: dict[str, Path]) -> None:
    prompt, before = greedy(server)
    assert before == transformers_greedy(models["a"], prompt, len(before))
    resp = load(server, {"model_dir": str(models["b"])})
    assert resp.status_code == 200, resp.text
    assert resp.json()["model_dir"] == str(models["b"]) and resp.json()["seconds"] >= 0
    _, after = greedy(server)
    assert after == transformers_greedy(models["b"], prompt, len(after)) and after != before
    card = httpx.get(f"{server}/v1/models").json()["data"][0]
    assert card["id"] == "tiny" and card["root"] == str(models["b"])


@pytest.mark.parametrize("body, message", [
    ({"model_dir": 3}, "must be a JSON object"),
    (["x"], "must be a JSON object"),
    ({}, "must be a JSON object"),
    ({"model_dir": "/nonexistent/ckpt"}, "has no config.json"),
    ({"model_dir": "<vocab>"}, "tokenizer.json differs"),
    ({"model_dir": "<wide>"}, "another architecture"),
])
def test_bad_reload_is_refused_and_changes_nothing(server: str, models: dict[str, Path], body: object,
                                                    message: str) -> None:
    prompt, before = greedy(server)
    if isinstance(body, dict) and str(body.get("model_dir", "")).startswith("<"):
        body = {"model_dir": str(models[body["model_dir"].strip("<>")])}
    resp = load(server, body)
    assert resp.status_code == 400 and message in resp.json()["error"]["message"], resp.text
    assert greedy(server) == (prompt, before)


def test_malformed_json_is_refused(server: str) -> None:
    resp = httpx.post(f"{server}/v1/load_weights", content=b"{nope", timeout=60)
    assert resp.status_code == 400 and "malformed JSON" in resp.text
    assert httpx.get(f"{server}/v1/load_weights").status_code == 405


def test_swap_waits_for_the_running_batch(models: dict[str, Path]) -> None:
    """A control call queued while a batch runs executes after it; the batch keeps its weights."""
    engine = Engine(EngineConfig(models["a"]))
    try:
        started, release = threading.Event(), threading.Event()
        original = engine._generate_batch

        def slow_batch(batch):
            started.set()
            release.wait(10)
            original(batch)

        engine._generate_batch = slow_batch  # type: ignore[method-assign]
        seen: list[object] = []

        async def scenario() -> list[int]:
            prompt = engine.tokenizer.encode("hello there", add_special_tokens=False)
            params = SamplingParams(temperature=0.0, max_tokens=5)
            gen = engine.generate(prompt, params)
            first = asyncio.ensure_future(gen.__anext__())
            await asyncio.to_thread(started.wait, 10)
            future = engine.between_batches(lambda: seen.append(engine.model))
            await asyncio.sleep(0.05)
            assert not future.done()  # the batch is still running
            release.set()
            events = [await first] + [e async for e in gen]
            await asyncio.wrap_future(future)
            return [e.token_id for e in events if hasattr(e, "token_id")]

        ids = asyncio.run(scenario())
        assert len(ids) >= 1 and seen == [engine.model]
    finally:
        engine.close()

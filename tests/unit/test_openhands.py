"""The OpenHands adapter without its env: settings, spec, environment, result classification, tmux cleanup,
interpreter search and the error for a version that is not on PyPI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

import harness_adapters.openhands as oh
from harness_adapters.openhands import OpenHandsConfig, OpenHandsHarness
from harness_adapters.processes import DUMMY_API_KEY, ProcessOutcome
from repro.common.configs import CONFIG_DIR
from repro.common.venvs import HarnessEnv, HarnessEnvError
from repro.protocols import HarnessRollout
from repro.tasks.schema import Task

PIP_MISSING = (
    "pip install failed (exit 1); full log: /x/pip-install.log\n--- last 30 lines ---\n"
    "ERROR: Could not find a version that satisfies the requirement openhands-sdk==1.58.99 (from versions: "
    "1.0.0, 1.57.0, 1.58.0, 1.58.1, 1.58.2)\nERROR: No matching distribution found for openhands-sdk==1.58.99\n"
)


def fake_env(tmp_path: Path) -> HarnessEnv:
    """An env folder with a site-packages holding a few of the files the identity hashes."""
    site = tmp_path / "env" / "lib" / "python3.12" / "site-packages"
    for rel in ("openhands/sdk/context/prompts/sections/static.py", "openhands/sdk/context/condenser/prompts/a.j2",
                "openhands/tools/terminal/descriptions.py", "openhands/sdk/context/prompts/__pycache__/x.py"):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(rel)
    root = tmp_path / "env"
    return HarnessEnv("openhands", "1.58.2", root, root / "bin" / "python", root / "bin")


def rollout(tmp_path: Path) -> HarnessRollout:
    task = Task(instance_id="t", repo="o/r", base_commit="0" * 40, problem_statement="Fix it.")
    return HarnessRollout("r1", task, tmp_path / "work", "http://127.0.0.1:9/rollouts/r1/v1", "tiny",
                          tmp_path / "out", 60.0)


def test_config_checks_and_yaml() -> None:
    with pytest.raises(ValueError, match="condenser must be"):
        OpenHandsConfig(condenser="llm")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="condenser_keep_first"):
        OpenHandsConfig(condenser_max_size=6, condenser_keep_first=2)
    OpenHandsConfig(condenser="none", condenser_max_size=6, condenser_keep_first=2)  # sizes unused then
    with pytest.raises(ValueError, match="extra_llm may not set"):
        OpenHandsConfig(extra_llm={"api_key": "x"})
    with pytest.raises(ValueError, match="max_iterations"):
        OpenHandsConfig(max_iterations=0)
    data = yaml.safe_load((CONFIG_DIR / "harness/openhands.yaml").read_text())
    assert data.pop("_target_") == "harness_adapters.openhands.OpenHandsConfig"
    cfg = OpenHandsConfig(**data)
    assert cfg.version == oh.DEFAULT_VERSION and cfg.step_limit == cfg.max_iterations and cfg.wall_time_limit_s == 0


def test_settings_and_llm_fields() -> None:
    assert OpenHandsConfig().llm_fields() == {"num_retries": 0, "timeout": 600}
    cfg = OpenHandsConfig(temperature=0.5, max_tokens=64, extra_llm={"top_p": 0.9}, command_timeout_s=10)
    assert cfg.llm_fields() == {"num_retries": 0, "timeout": 600, "temperature": 0.5, "max_output_tokens": 64,
                                "top_p": 0.9, "capability_overrides": {"supports_sampling_params": True}}
    both = OpenHandsConfig(temperature=0.0, extra_llm={"capability_overrides": {"supports_vision": False}})
    assert both.llm_fields()["capability_overrides"] == {"supports_sampling_params": True, "supports_vision": False}
    settings = cfg.settings()
    assert settings["condenser"]["kind"] == "summarizing" and settings["condenser"]["max_size"] == 80
    assert settings["tools"] == ["terminal", "file_editor", "task_tracker", "finish", "think"]
    assert OpenHandsConfig(condenser="none").settings()["condenser"] == {"kind": "none"}
    assert "max_tokens" not in settings["condenser"]  # unset: the identity is what it was before the field
    assert OpenHandsConfig(condenser_max_tokens=7100).settings()["condenser"]["max_tokens"] == 7100


def test_identity_and_rollout_spec(tmp_path: Path) -> None:
    harness = OpenHandsHarness(OpenHandsConfig(command_timeout_s=12), env=fake_env(tmp_path))
    identity = harness.identity()
    assert set(identity) == {"name", "version", "files_sha256", "packages", "settings"}
    assert identity["name"] == "openhands" and identity["version"] == "1.58.2"
    assert set(identity["files_sha256"]) == {"openhands_runner.py", "openhands/sdk/context/prompts/sections/static.py",
                                             "openhands/sdk/context/condenser/prompts/a.j2",
                                             "openhands/tools/terminal/descriptions.py"}
    assert set(identity["packages"]) == {"openhands-sdk", "openhands-tools", "litellm", "openai"}
    spec = harness.rollout_spec(rollout(tmp_path))
    assert spec["model"] == "openai/tiny" and spec["base_url"].endswith("/rollouts/r1/v1")
    assert spec["summary_base_url"] == "http://127.0.0.1:9/rollouts/r1/purpose/summary/v1"
    assert spec["terminal"] == {"no_change_timeout_seconds": 12}
    assert spec["condenser"]["max_tokens"] is None
    by_tokens = OpenHandsHarness(OpenHandsConfig(condenser_max_tokens=7100), env=fake_env(tmp_path))
    assert by_tokens.rollout_spec(rollout(tmp_path))["condenser"]["max_tokens"] == 7100
    assert "key" not in json.dumps(spec).lower()


def test_process_env_is_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real-secret")
    monkeypatch.setenv("LMNR_PROJECT_API_KEY", "lmnr")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel")
    env = oh.build_process_env(home=tmp_path / "home", tmux_tmpdir=tmp_path / "tmux")
    assert env["OPENAI_API_KEY"] == DUMMY_API_KEY and env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert env["TMUX_TMPDIR"] == str(tmp_path / "tmux") and env["HOME"] == str(tmp_path / "home")
    assert not any(k.startswith(("LMNR", "OTEL")) for k in env)
    assert (tmp_path / "home" / ".config").is_dir()


def _outcome(exit_code: int | None = 0, timed_out: bool = False) -> ProcessOutcome:
    return ProcessOutcome(exit_code=exit_code, timed_out=timed_out, duration_s=1.5, cpu_s=1.0)


@pytest.mark.parametrize(("exit_status", "status"), [("finished", "finished"), ("max_iterations", "finished"),
                                                      ("stuck", "finished"), ("error", "crashed")])
def test_result_classification(tmp_path: Path, exit_status: str, status: str) -> None:
    result = {"exit_status": exit_status, "n_llm_calls": {"agent": 3, "condenser": 1},
              "error": "ConversationRunError: boom\nmore", "traceback": "Traceback ...", "execution_status": "x"}
    (tmp_path / oh.RESULT_NAME).write_text(json.dumps(result))
    (tmp_path / "events.jsonl").write_text("{}\n")
    res = oh.as_result("r", _outcome(), tmp_path, 60)
    assert (res.status, res.exit_status, res.n_model_calls) == (status, exit_status, 4)
    assert res.trajectory_path == str(tmp_path / "events.jsonl")
    assert res.info["calls_by_usage"] == {"agent": 3, "condenser": 1}
    if status == "crashed":
        assert res.reason == "exit status error: ConversationRunError: boom"


def test_result_without_runner_output(tmp_path: Path) -> None:
    (tmp_path / "stderr.log").write_text("Traceback...\nModuleNotFoundError: No module named 'openhands'\n")
    res = oh.as_result("r", _outcome(exit_code=1), tmp_path, 60)
    assert res.status == "crashed" and res.reason.endswith("No module named 'openhands'") and res.n_model_calls == 0
    res = oh.as_result("r", _outcome(exit_code=None, timed_out=True), tmp_path, 7)
    assert (res.status, res.reason) == ("timeout", "killed after 7 s")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_kill_tmux_servers_kills_server_and_commands() -> None:
    tmux_dir = Path(tempfile.mkdtemp(prefix="oh-tmux-t-", dir="/tmp"))
    try:
        env = os.environ | {"TMUX_TMPDIR": str(tmux_dir)}
        subprocess.run(["tmux", "new-session", "-d", "-s", "s", "sleep 300"], env=env, check=True, timeout=10)
        socket = next(tmux_dir.glob("tmux-*/default"))
        pid = int(subprocess.run(["tmux", "-S", str(socket), "display-message", "-p", "#{pid}"], capture_output=True,
                                 text=True, check=True).stdout)
        assert oh.kill_tmux_servers(tmux_dir) == 1
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        assert not _alive(pid)
        assert oh.kill_tmux_servers(tmux_dir) == 0  # a stale socket is no server
    finally:
        shutil.rmtree(tmux_dir, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as handle:  # a zombie (not reaped by us: it is tmux's) counts as gone
        return handle.read().split()[2] != "Z"


def test_missing_version_names_it_and_the_nearest() -> None:
    message = oh.missing_version_message(PIP_MISSING, "1.58.99")
    assert message is not None and "OpenHands 1.58.99 does not exist" in message
    assert "openhands-sdk==1.58.99" in message and "1.58.2" in message
    assert oh.missing_version_message("ERROR: some other failure", "1.58.99") is None


def test_ensure_env_turns_pip_failure_into_version_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> HarnessEnv:
        raise HarnessEnvError(PIP_MISSING)

    monkeypatch.setattr(oh, "ensure_harness_env", fail)
    with pytest.raises(HarnessEnvError, match=r"OpenHands 1\.58\.99 does not exist.*nearest releases: .*1\.58\.2"):
        oh.ensure_openhands_env("1.58.99", python="/usr/bin/python3")


def test_find_python(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(oh.shutil, "which", lambda name: None)
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "no-pyenv"))
    with pytest.raises(HarnessEnvError, match=r"needs Python >= 3\.12.*pyenv install 3\.12"):
        oh.find_python()
    monkeypatch.undo()
    try:
        found = oh.find_python()
    except HarnessEnvError:
        pytest.skip("no Python >= 3.12 on this machine")
    version = subprocess.run([found, "-c", "import sys; print(sys.version_info >= (3, 12))"], capture_output=True,
                             text=True, check=True).stdout.strip()
    assert version == "True"


def test_launcher_is_checked_and_not_in_the_identity(tmp_path: Path) -> None:
    assert OpenHandsConfig().launcher == "fork"
    with pytest.raises(ValueError, match="launcher must be one of fork, exec"):
        OpenHandsConfig(launcher="spawn")
    env = fake_env(tmp_path)
    identities = [OpenHandsHarness(OpenHandsConfig(launcher=name), env=env).identity() for name in ("fork", "exec")]
    assert identities[0] == identities[1]  # the model sees the same either way: one frozen spec for both

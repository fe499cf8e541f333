"""OpenCode adapter without network or the real binary: the generated opencode.json (providers, title routing,
steps, compaction), the command line and isolated environment, the config dir, version checks, the identity, and
run -> result classification against a fake ``opencode`` (finished, error event, crash, timeout, order)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import harness_adapters.npm_env as npm_env
from harness_adapters.opencode import (
    AUX_PROVIDER,
    DISABLED,
    DUMMY_API_KEY,
    PROVIDER,
    SUMMARY_PROVIDER,
    OpenCodeConfig,
    OpenCodeHarness,
    build_command,
    build_process_env,
    opencode_config,
    parse_events,
    prepare_home,
    route_urls,
)
from harness_adapters.opencode_env import OpenCodeEnv, build_sha256, check_version_exists, is_valid
from harness_adapters.registry import get_harness
from repro.common.configs import CONFIG_DIR
from repro.common.venvs import MARKER_NAME, HarnessEnvError
from repro.protocols import HarnessRollout
from repro.tasks.schema import Task

BASE = "http://127.0.0.1:9/rollouts/r1/v1"
AUX = "http://127.0.0.1:9/rollouts/r1/purpose/auxiliary/v1"
SUMMARY = "http://127.0.0.1:9/rollouts/r1/purpose/summary/v1"
# A stand-in for `opencode`: `run` reads the task from stdin and acts on its first word; `export` prints a session.
FAKE_OPENCODE = """\
import json, os, sys, time
if sys.argv[1] == "export":
    print("Exporting session: " + sys.argv[2], file=sys.stderr)
    print(json.dumps({"info": {"id": sys.argv[2], "title": "t"}, "messages": []}))
    sys.exit(0)
task = sys.stdin.read()
word = task.split()[0]
def emit(kind, **extra):
    print(json.dumps({"type": kind, "sessionID": "ses_1", **extra}), flush=True)
open("seen.json", "w").write(json.dumps({"argv": sys.argv[1:], "task": task, "env": dict(os.environ)}))
if word == "hang":
    time.sleep(60)
if word == "crash":
    sys.exit("panic: boom")
emit("step_start", part={"type": "step-start"})
if word == "error":
    emit("error", error={"name": "APIError", "data": {"message": "Cannot connect to API"}})
    sys.exit(1)
emit("text", part={"type": "text", "text": "hi"})
emit("step_finish", part={"type": "step-finish", "reason": "stop"})
"""


@pytest.fixture
def fake_env(tmp_path: Path) -> OpenCodeEnv:
    return make_fake_env(tmp_path)


def make_fake_env(tmp_path: Path) -> OpenCodeEnv:
    """An installed-looking OpenCode env whose binary is FAKE_OPENCODE."""
    root = tmp_path / "env"
    env = OpenCodeEnv("1.18.33", root)
    env.binary.parent.mkdir(parents=True)
    env.binary.write_text(f"#!{sys.executable}\n{FAKE_OPENCODE}")
    env.binary.chmod(0o755)
    (env.config_deps / "node_modules" / "@opencode-ai" / "plugin").mkdir(parents=True)
    (env.config_deps / "package.json").write_text('{"dependencies": {"@opencode-ai/plugin": "1.18.33"}}')
    (env.config_deps / "package-lock.json").write_text(
        '{"packages": {"": {"dependencies": {"@opencode-ai/plugin": "1.18.33"}}}}')
    env.bin_dir.mkdir(parents=True)
    marker = {"sha256": build_sha256("1.18.33"), "installed": {"opencode-ai": "1.18.33", "ripgrep (PyPI)": "14.1.0"}}
    (root / MARKER_NAME).write_text(json.dumps(marker))
    return env


def test_config_routes_title_to_the_auxiliary_purpose() -> None:
    cfg = OpenCodeConfig(output_limit=256)
    assert route_urls(BASE) == {"policy": BASE, "auxiliary": AUX, "summary": SUMMARY}
    config = opencode_config(cfg, "qwen3-coder", route_urls(BASE))
    assert config["model"] == f"{PROVIDER}/qwen3-coder" and config["small_model"] == f"{AUX_PROVIDER}/qwen3-coder"
    main, aux = config["provider"][PROVIDER], config["provider"][AUX_PROVIDER]
    assert main["npm"] == aux["npm"] == "@ai-sdk/openai-compatible"
    assert main["options"] == {"baseURL": BASE, "apiKey": DUMMY_API_KEY} and aux["options"]["baseURL"] == AUX
    assert main["models"] == {"qwen3-coder": {"name": "qwen3-coder", "limit": {"context": 32768, "output": 256}}}
    assert config["autoupdate"] is False and config["share"] == "disabled"
    assert config["provider"][SUMMARY_PROVIDER]["options"]["baseURL"] == SUMMARY
    assert config["agent"] == {"compaction": {"model": f"{SUMMARY_PROVIDER}/qwen3-coder"}}
    assert config["compaction"] == {"auto": True, "prune": False}


def test_config_options_train_title_steps_compaction_extra() -> None:
    cfg = OpenCodeConfig(train_title=True, train_compaction=True, step_limit=7, compaction_auto=False,
                         compaction_reserved=1000, extra_config={"compaction": {"prune": True}, "snapshot": False})
    config = opencode_config(cfg, "m", route_urls(BASE))
    assert config["small_model"] == f"{PROVIDER}/m" and list(config["provider"]) == [PROVIDER]
    assert config["agent"] == {"build": {"steps": 7}}
    title_only = opencode_config(OpenCodeConfig(train_title=True), "m", route_urls(BASE))
    assert sorted(title_only["provider"]) == [PROVIDER, SUMMARY_PROVIDER] and title_only["small_model"] == "repro/m"
    assert config["compaction"] == {"auto": False, "prune": True, "reserved": 1000}
    assert config["snapshot"] is False
    with pytest.raises(ValueError):
        OpenCodeConfig(step_limit=-1)


def test_command_and_isolated_environment(fake_env: OpenCodeEnv, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert build_command(fake_env, "m", "build") == [str(fake_env.binary), "run", "-m", "repro/m", "--agent",
                                                     "build", "--auto", "--format", "json", "--print-logs",
                                                     "--log-level", "INFO"]
    home = tmp_path / "home"
    env = build_process_env(fake_env, OpenCodeConfig(), home, tmp_path / "opencode.json")
    assert env["PATH"] == f"{fake_env.bin_dir}:/usr/bin:/bin"
    assert env["HOME"] == str(home) and env["XDG_STATE_HOME"] == str(home / ".local/state")
    assert env["XDG_CONFIG_HOME"] == str(home / ".config") and env["XDG_CACHE_HOME"] == str(home / ".cache")
    assert env["OPENCODE_CONFIG"] == str(tmp_path / "opencode.json")
    assert DISABLED.items() <= env.items() and env["OPENCODE_DISABLE_PROJECT_CONFIG"] == "1"
    assert "OPENAI_API_KEY" not in env
    assert "OPENCODE_DISABLE_PROJECT_CONFIG" not in build_process_env(
        fake_env, OpenCodeConfig(project_config=True), home, tmp_path / "c.json")


def test_config_dir_has_the_dependency_opencode_would_install(fake_env: OpenCodeEnv, tmp_path: Path) -> None:
    home = tmp_path / "home"
    prepare_home(fake_env, home)
    prepare_home(fake_env, home)  # idempotent
    config_dir = home / ".config" / "opencode"
    assert (config_dir / "node_modules").resolve() == (fake_env.config_deps / "node_modules").resolve()
    lock = json.loads((config_dir / "package-lock.json").read_text())
    assert "@opencode-ai/plugin" in lock["packages"][""]["dependencies"]
    assert (home / ".local" / "share").is_dir() and (home / ".local" / "state").is_dir()


def test_missing_version_names_it_and_its_neighbours(monkeypatch) -> None:
    answers = {"view opencode-ai@1.18.24 version": {"error": {"code": "E404"}},
               "view opencode-ai versions": ["1.18.22", "1.18.23", "1.18.25", "1.18.26", "1.18.33"]}
    monkeypatch.setattr(npm_env, "npm_json", lambda args: answers[" ".join(args)])
    with pytest.raises(HarnessEnvError, match=r"opencode-ai@1\.18\.24 does not exist on npm.*1\.18\.23, 1\.18\.25"):
        check_version_exists("1.18.24")
    answers["view opencode-ai@1.18.33 version"] = "1.18.33"
    check_version_exists("1.18.33")


def test_env_validity_follows_the_marker(fake_env: OpenCodeEnv) -> None:
    (fake_env.root / "npm").mkdir(exist_ok=True)
    assert is_valid(fake_env.root, "1.18.33") and not is_valid(fake_env.root, "1.18.32")
    assert fake_env.packages()["opencode-ai"] == "1.18.33"


def test_identity_hashes_the_config_template(fake_env: OpenCodeEnv, tmp_path: Path) -> None:
    with OpenCodeHarness(OpenCodeConfig(model_name="qwen3"), env=fake_env, state_dir=tmp_path / "s") as harness:
        identity = harness.identity()
    assert identity["name"] == "opencode" and identity["version"] == "1.18.33"
    assert set(identity["files_sha256"]) == {"opencode.json", "config-deps/package-lock.json"}
    assert identity["packages"] == {"opencode-ai": "1.18.33", "ripgrep (PyPI)": "14.1.0"}
    settings = identity["settings"]
    assert settings["model_name"] == "qwen3" and settings["title"] == "auxiliary"
    assert settings["compaction_call"] == "summary"
    assert settings["compaction"] == {"auto": True, "prune": False} and settings["env"] == DISABLED
    template = json.loads((tmp_path / "s" / "opencode.json").read_text())
    assert template["provider"][AUX_PROVIDER]["options"]["baseURL"] == "{base_url:purpose=auxiliary}"
    with OpenCodeHarness(OpenCodeConfig(model_name="qwen3", compaction_auto=False), env=fake_env,
                         state_dir=tmp_path / "t") as other:
        assert other.identity()["files_sha256"]["opencode.json"] != identity["files_sha256"]["opencode.json"]


def _rollout(tmp_path: Path, rollout_id: str, statement: str, timeout_s: float = 30) -> HarnessRollout:
    workdir = tmp_path / rollout_id / "work"
    workdir.mkdir(parents=True)
    task = Task(instance_id=rollout_id, repo="o/r", base_commit="0" * 40, problem_statement=statement)
    return HarnessRollout(rollout_id, task, workdir, f"http://127.0.0.1:9/rollouts/{rollout_id}/v1", "tiny",
                          tmp_path / rollout_id / "out", timeout_s)


def test_run_classifies_each_rollout_in_order(fake_env: OpenCodeEnv, tmp_path: Path) -> None:
    statement = 'ok -- a task "with quotes"\nand a second line'
    rollouts = [_rollout(tmp_path, "ok", statement), _rollout(tmp_path, "error", "error now"),
                _rollout(tmp_path, "crash", "crash now"), _rollout(tmp_path, "hang", "hang now", timeout_s=2)]
    with OpenCodeHarness(OpenCodeConfig(), env=fake_env, state_dir=tmp_path / "s") as harness:
        ok, error, crash, hang = harness.run(rollouts, concurrency=4)
    assert (ok.status, ok.exit_status, ok.n_model_calls) == ("finished", "stop", 1), ok
    assert ok.trajectory_path and json.loads(Path(ok.trajectory_path).read_text())["info"]["id"] == "ses_1"
    seen: dict[str, Any] = json.loads((tmp_path / "ok/work/seen.json").read_text())
    assert seen["task"] == statement and seen["argv"][:3] == ["run", "-m", "repro/tiny"]
    config = json.loads(Path(seen["env"]["OPENCODE_CONFIG"]).read_text())
    assert config["provider"][AUX_PROVIDER]["options"]["baseURL"].endswith("/rollouts/ok/purpose/auxiliary/v1")
    assert error.status == "crashed" and "Cannot connect to API" in error.reason and error.exit_status == "error"
    assert crash.status == "crashed" and "panic: boom" in crash.reason and crash.n_model_calls == 0
    assert hang.status == "timeout" and hang.duration_s < 20
    record = json.loads((tmp_path / "ok/out/harness_run.json").read_text())
    assert record["identity"]["name"] == "opencode" and DUMMY_API_KEY not in json.dumps(record["identity"])


def test_registry_and_hydra_config(fake_env: OpenCodeEnv, tmp_path: Path) -> None:
    path = CONFIG_DIR / "harness" / "opencode.yaml"
    data = yaml.safe_load(path.read_text())
    assert data.pop("_target_") == "harness_adapters.opencode.OpenCodeConfig"
    assert OpenCodeConfig(**data) == OpenCodeConfig()
    harness = get_harness("opencode", data, check=False, env=fake_env, state_dir=tmp_path / "s")
    assert isinstance(harness, OpenCodeHarness) and harness.cfg == OpenCodeConfig()
    harness.close()


def test_parse_events_skips_log_lines() -> None:
    text = 'INFO something\n{"type": "text", "sessionID": "s"}\n{broken\n'
    assert parse_events(text) == [{"type": "text", "sessionID": "s"}]
    assert os.path.basename(str(OpenCodeEnv("1", Path("/x")).binary)) == "opencode"

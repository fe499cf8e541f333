"""mini-SWE-agent 1.x support without network: version / mode checks, the settings and the single merged config
file, the command line, the registry choice, and the run -> result classification against a fake ``mini``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

import harness_adapters.mini_swe_agent.adapter as mini
from harness_adapters.mini_swe_agent.adapter import (
    MiniSweAgentConfig,
    base_config,
    ensure_mini_swe_agent_env,
    fixed_prompt_texts,
    harness_settings,
    harness_tools,
    is_v1,
    major_version,
)
from harness_adapters.mini_swe_agent.pool import MiniSweAgentHarness
from harness_adapters.mini_swe_agent.v1 import MiniSweAgentV1Harness, build_command, merge_configs
from harness_adapters.registry import get_harness, harness_class
from repro.common.venvs import HarnessEnv, HarnessEnvError
from repro.protocols import HarnessRollout
from repro.tasks.schema import Task

V1 = MiniSweAgentConfig(version="1.17.5", mode="text", step_limit=4, max_tokens=32, temperature=0.0)
V1_YAML = """\
agent:
  system_template: |
    You are a helpful assistant that can interact with a computer.

    Reply with exactly ONE bash code block.
  instance_template: |
    Please solve this issue: {{task}}

    Submit with `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`.
  action_observation_template: |
    <returncode>{{output.returncode}}</returncode>
  format_error_template: |
    Please always provide EXACTLY ONE action in triple backticks, found {{actions|length}} actions.
  step_limit: 0.
  cost_limit: 3.
  mode: confirm
environment:
  env:
    PAGER: cat
model:
  model_kwargs:
    drop_params: true
"""
# A stand-in for 1.17.5's ``mini``: parses the same options, answers by the task's first word, writes the
# trajectory the way 1.x does (once, at the end).
FAKE_MINI = """\
import json, sys, time
import yaml
args = sys.argv[1:]
opt = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i] in ("-m", "-l", "-o", "-c")}
task = next(a for a in args if a.startswith("--task="))[len("--task="):]
config = yaml.safe_load(open(opt["-c"]).read())
word = task.split()[0]
info = {"exit_status": None, "submission": "", "model_stats": {"instance_cost": 0.0, "api_calls": 1},
        "config": config, "argv": args}
if word == "hang":
    time.sleep(60)
if word == "crash":
    sys.exit("TypeError: bad config")
if word == "submit":
    info["exit_status"], info["submission"] = "Submitted", "diff"
elif word == "limit":
    step, cost = sys.stdin.readline(), sys.stdin.readline()
    ok = int(step) == config["agent"]["step_limit"] and float(cost) == 0
    info["exit_status"] = "LimitsExceeded" if ok else "EOFError"
    info["model_stats"]["api_calls"] = int(step)
elif word == "boom":
    info["exit_status"], info["submission"] = "APIConnectionError", "Connection error."
    info["traceback"] = "Traceback (most recent call last):\\n  ...\\nlitellm.APIConnectionError: Connection error.\\n"
open(opt["-o"], "w").write(json.dumps({"info": info, "messages": [], "trajectory_format": "mini-swe-agent-1"}))
"""


def fake_env(tmp_path: Path, version: str = "1.17.5") -> HarnessEnv:
    """Just enough of an installed 1.x env: its builtin mini.yaml, package versions and a fake ``mini``."""
    root = tmp_path / "env"
    site = root / "lib" / "python3.11" / "site-packages"
    (site / "minisweagent" / "config").mkdir(parents=True)
    (site / "minisweagent" / "config" / "mini.yaml").write_text(V1_YAML)
    for name, pin in {"mini-swe-agent": version, "litellm": "1.110.2", "openai": "3.57.0"}.items():
        info = site / f"{name.replace('-', '_')}-{pin}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {pin}\n")
    (root / "bin").mkdir()
    script = root / "bin" / "mini"
    script.write_text(f"#!{sys.executable}\n{FAKE_MINI}")
    script.chmod(0o755)
    return HarnessEnv("mini-swe-agent", version, root, root / "bin" / "python", root / "bin")


def rollout(tmp_path: Path, rollout_id: str, statement: str, timeout_s: float = 30.0) -> HarnessRollout:
    workdir = tmp_path / rollout_id / "work"
    workdir.mkdir(parents=True)
    task = Task(instance_id=rollout_id, repo="o/r", base_commit="0" * 40, problem_statement=statement)
    return HarnessRollout(rollout_id, task, workdir, f"http://127.0.0.1:9/rollouts/{rollout_id}/v1", "tiny",
                          tmp_path / rollout_id / "out", timeout_s)


def test_versions() -> None:
    assert (major_version("1.17.5"), major_version("2.4.6"), major_version("x")) == (1, 2, None)
    assert is_v1("1.17.5") and not is_v1("2.4.6") and not is_v1("11.0")
    assert mini.PINNED_PACKAGES["1.17.5"] == ["mini-swe-agent==1.17.5", "litellm==1.110.2", "openai==3.57.0"]


@pytest.mark.parametrize("version", ["9.9.9", "0.1.0", "latest"])
def test_unsupported_version_is_refused_by_name(version: str) -> None:
    with pytest.raises(ValueError, match=f"mini-SWE-agent '{version}' is not supported"):
        ensure_mini_swe_agent_env(version)


def test_install_failure_names_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(name: str, version: str, packages: list[str]) -> HarnessEnv:
        raise HarnessEnvError(f"pip install failed (exit 1)\nNo matching distribution found for {packages[0]}")

    monkeypatch.setattr(mini, "ensure_harness_env", failing)
    with pytest.raises(HarnessEnvError, match=r"^could not install mini-SWE-agent 2\.99\.0: pip install failed"):
        ensure_mini_swe_agent_env("2.99.0")


def test_v1_is_text_only_and_has_no_wall_time_limit() -> None:
    with pytest.raises(ValueError, match=r"1\.17\.5 \(1\.x\) is text-only .*set mode: text"):
        MiniSweAgentConfig(version="1.17.5")
    with pytest.raises(ValueError, match="text-only"):
        get_harness("mini-swe-agent", {"version": "1.17.5", "mode": "toolcall"})
    with pytest.raises(ValueError, match="no wall-time limit"):
        MiniSweAgentConfig(version="1.17.5", mode="text", wall_time_limit_s=60)


def test_settings_per_major_version() -> None:
    kwargs = {"drop_params": True, "num_retries": 0, "timeout": 600.0, "temperature": 0.0, "max_tokens": 32}
    assert harness_settings(V1) == {
        "agent": {"step_limit": 4, "cost_limit": 0.0},
        "environment": {"timeout": 30},
        "model": {"model_kwargs": kwargs},
    }
    assert harness_settings(MiniSweAgentConfig(step_limit=4)) == {  # 2.x as before
        "agent": {"step_limit": 4, "wall_time_limit_seconds": 0},
        "environment": {"timeout": 30},
        "model": {"model_kwargs": {"drop_params": True, "num_retries": 0, "timeout": 600.0}},
    }
    assert harness_settings(MiniSweAgentConfig(mode="text"))["model"]["model_class"] == "litellm_textbased"


def test_merge_configs() -> None:
    base = {"agent": {"a": 1, "t": "x"}, "model": {"model_kwargs": {"drop_params": True}}, "keep": [1]}
    over = {"agent": {"a": 2}, "model": {"model_kwargs": {"api_base": "u"}}, "keep": [2]}
    assert merge_configs(base, over) == {"agent": {"a": 2, "t": "x"},
                                         "model": {"model_kwargs": {"drop_params": True, "api_base": "u"}},
                                         "keep": [2]}
    assert base["agent"] == {"a": 1, "t": "x"}  # inputs untouched


def test_prompt_helpers_read_the_v1_config(tmp_path: Path) -> None:
    env = fake_env(tmp_path)
    assert harness_tools(V1) == []  # no env needed: 1.x sends no tools
    assert base_config(V1, env) == yaml.safe_load(V1_YAML)
    texts = fixed_prompt_texts(V1, env)
    assert "You are a helpful assistant that can interact with a computer." in texts
    assert all("{{" not in text for text in texts)


def test_registry_picks_the_v1_class(tmp_path: Path) -> None:
    assert harness_class("mini-swe-agent", "1.17.5") is MiniSweAgentV1Harness
    assert harness_class("mini-swe-agent", "2.4.6") is MiniSweAgentHarness
    assert harness_class("mini-swe-agent") is MiniSweAgentHarness
    cfg = {"version": "1.17.5", "mode": "text", "step_limit": 4}
    with get_harness("mini-swe-agent", cfg, env=fake_env(tmp_path), state_dir=tmp_path / "s", workers=2) as harness:
        assert isinstance(harness, MiniSweAgentV1Harness) and harness.name == "mini-swe-agent"
        identity = harness.identity()
        assert (identity["name"], identity["version"]) == ("mini-swe-agent", "1.17.5")
        assert set(identity["files"]) == {"repro-mswea-base.yaml", "repro-mswea-settings.yaml"}
        assert (tmp_path / "s/config/repro-mswea-base.yaml").read_text() == V1_YAML  # copied unchanged
    with pytest.raises(ValueError, match=r"1\.x CLI"):
        MiniSweAgentHarness(V1, env=fake_env(tmp_path / "b"), state_dir=tmp_path / "p")


def test_command_and_run_config(tmp_path: Path) -> None:
    env = fake_env(tmp_path)
    one = rollout(tmp_path, "r1", "-starts with a dash")
    with MiniSweAgentV1Harness(V1, env=env, state_dir=tmp_path / "state") as harness:
        config = harness.run_config(one)
    traj, path = tmp_path / "t.json", tmp_path / "c.yaml"
    assert build_command(env, "tiny", traj, path, one.task.problem_statement) == [
        str(env.bin_dir / "mini"), "-y", "--exit-immediately", "-m", "openai/tiny", "-l", "0",
        "-o", str(traj), "-c", str(path), "--task=-starts with a dash"]
    base = yaml.safe_load(V1_YAML)
    assert config["agent"] == base["agent"] | {"step_limit": 4, "cost_limit": 0.0}
    jailed = harness.identity()["isolation"] == "jail"  # jailed, the working copy is at /testbed in the jail
    where = "/testbed" if jailed else str(one.workdir.resolve())
    assert config["environment"] == {"env": {"PAGER": "cat"}, "timeout": 30, "cwd": where}
    assert config["model"] == {"model_kwargs": {"drop_params": True, "num_retries": 0, "timeout": 600.0,
                                                "temperature": 0.0, "max_tokens": 32, "api_base": one.base_url}}
    assert "run" not in config  # 1.x takes the task from -t only


def test_run_classifies_each_ending(tmp_path: Path) -> None:
    statements = {"ok": "submit it", "lim": "limit reached", "boom": "boom goes the endpoint",
                  "crash": "crash before the loop", "hang": "hang forever"}
    rollouts = [rollout(tmp_path, rid, text, timeout_s=3.0 if rid == "hang" else 30.0)
                for rid, text in statements.items()]
    # a fake ``mini`` script (no minisweagent to import): exec'd; the fork launcher runs the real one (integration)
    with MiniSweAgentV1Harness(V1, env=fake_env(tmp_path), state_dir=tmp_path / "state", launcher="exec") as harness:
        results = harness.run(rollouts, concurrency=5)
        with pytest.raises(ValueError, match="unique"):
            harness.run(rollouts[:1] * 2, concurrency=1)
    by_id = {r.rollout_id: r for r in results}
    assert [r.rollout_id for r in results] == list(statements)
    assert (by_id["ok"].status, by_id["ok"].exit_status, by_id["ok"].reason) == ("finished", "Submitted", "Submitted")
    assert (by_id["lim"].status, by_id["lim"].exit_status, by_id["lim"].n_model_calls) == \
        ("finished", "LimitsExceeded", 4)  # the stdin answers repeat the step limit
    assert by_id["boom"].status == "crashed" and by_id["boom"].exit_status == "APIConnectionError"
    assert by_id["boom"].reason == ("uncaught error, exit status APIConnectionError: "
                                    "litellm.APIConnectionError: Connection error.")
    assert by_id["crash"].status == "crashed" and by_id["crash"].reason.startswith("exit code 1")
    assert "TypeError: bad config" in by_id["crash"].reason
    assert by_id["hang"].status == "timeout" and by_id["hang"].trajectory_path is None
    trajectory = json.loads(Path(by_id["ok"].trajectory_path).read_text())
    assert trajectory["info"]["config"]["model"]["model_kwargs"]["api_base"].endswith("/rollouts/ok/v1")
    record = json.loads((tmp_path / "ok/out/harness_run.json").read_text())
    assert record["status"] == "finished" and record["identity"]["version"] == "1.17.5"
    assert record["command"][-1] == "--task=submit it"


def test_an_unknown_launcher_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="launcher must be one of"):
        MiniSweAgentV1Harness(V1, env=fake_env(tmp_path), state_dir=tmp_path / "state", launcher="spawn")

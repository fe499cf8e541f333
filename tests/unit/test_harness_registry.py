"""Harness registry: names, lazy imports, config coercion, and the error for an unknown name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness_adapters.mini_swe_agent.adapter import MiniSweAgentConfig
from harness_adapters.registry import (
    HARNESSES,
    UnknownHarnessError,
    canonical_name,
    get_harness,
    harness_class,
    harness_config,
    harness_names,
    name_for_config,
)
from repro.common.venvs import HarnessEnv

VERSIONS = {"mini-swe-agent": "2.4.6", "litellm": "1.110.2", "openai": "3.57.0"}


def fake_mini_env(tmp_path: Path) -> HarnessEnv:
    """Just enough of an installed env for the harness to write its config and read package versions."""
    root = tmp_path / "env"
    site = root / "lib" / "python3.11" / "site-packages"
    (site / "minisweagent" / "config").mkdir(parents=True)
    (site / "minisweagent" / "config" / "mini.yaml").write_text("agent:\n  step_limit: 0\n")
    for name, version in VERSIONS.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return HarnessEnv("mini-swe-agent", "2.4.6", root, root / "bin" / "python", root / "bin")


def test_every_entry_resolves() -> None:
    assert harness_names() == ["claude-code", "codex", "command", "mini-swe-agent", "opencode", "openhands",
                               "qwen-code"]
    for name in HARNESSES:
        assert harness_class(name).name == name
        config = harness_config(name, {"command": ["true"]} if name == "command" else None)  # it needs a command
        assert name_for_config(config) == name
    assert harness_config("mini-swe-agent") == MiniSweAgentConfig()


def test_unknown_name_lists_the_choices() -> None:
    with pytest.raises(UnknownHarnessError) as info:
        get_harness("aider", None)
    message = str(info.value)
    assert "'aider'" in message and "mini-swe-agent, opencode, openhands" in message
    assert isinstance(info.value, ValueError)


def test_name_spelling_is_forgiving() -> None:
    assert canonical_name("Mini_SWE_Agent") == "mini-swe-agent"
    assert canonical_name(" mini-swe-agent ") == "mini-swe-agent"


def test_config_coercion() -> None:
    cfg = MiniSweAgentConfig(step_limit=9)
    assert harness_config("mini-swe-agent", cfg) is cfg
    from_yaml = harness_config("mini-swe-agent", {"_target_": "x.Y", "step_limit": 7, "mode": "text"})
    assert from_yaml == MiniSweAgentConfig(step_limit=7, mode="text")
    with pytest.raises(TypeError, match="MiniSweAgentConfig"):
        harness_config("mini-swe-agent", 3)
    with pytest.raises(TypeError):
        harness_config("mini-swe-agent", {"no_such_field": 1})


def test_get_harness_builds_the_pool_without_starting_workers(tmp_path: Path) -> None:
    harness = get_harness(
        "mini_swe_agent", {"step_limit": 4}, env=fake_mini_env(tmp_path), state_dir=tmp_path / "state", workers=2
    )
    try:
        assert type(harness).__name__ == "MiniSweAgentHarness"
        assert harness.cfg.step_limit == 4
        assert harness.worker_pids() == [] and harness.n_worker_starts == 0
        identity = harness.identity()
        assert (identity["name"], identity["version"]) == ("mini-swe-agent", "2.4.6")
        assert identity["packages"] == VERSIONS
        assert set(identity["files"]) == {"repro-mswea-base.yaml", "repro-mswea-settings.yaml"}
    finally:
        harness.close()


def test_registry_imports_no_harness_until_asked() -> None:
    code = (
        "import sys, harness_adapters.registry as r\n"
        "assert 'harness_adapters.mini_swe_agent.pool' not in sys.modules\n"
        "r.harness_class('mini-swe-agent')\n"
        "assert 'harness_adapters.mini_swe_agent.pool' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)

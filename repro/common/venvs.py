"""Isolated, cached virtual environments for harnesses, one per (harness, version).

A harness (mini-SWE-agent, ...) never runs in the project's own venv: its dependencies (LiteLLM, the
OpenAI SDK, ...) decide what goes over the wire, so they are pinned and installed apart, under
``$REPRO_CACHE_DIR`` (default ``~/.cache/repro``) ``/harness-envs/<name>-<version>/``.

Build protocol (idempotent, safe across processes):

- the env is valid only when its marker file ``.repro-env.json`` exists and carries the sha256 of the
  requested build (packages + base interpreter); the marker is written last, atomically, after pip succeeded;
- anything else at that path (a half-made env, a different package list) is deleted and rebuilt;
- builders serialise on an ``fcntl`` lock file beside the env and re-check the marker once they hold it.

The venv is created without its own pip (saves ~4.5 s of ``ensurepip``); packages are installed by the
calling interpreter's pip through ``pip --python <env python>``. Where the caller has no pip, the venv gets
its own. pip installs without byte-compiling; the env's interpreter then compiles site-packages on every core
(:func:`compile_bytecode`; the same ``.pyc`` files, ~9 s sooner for mini-SWE-agent on 2 cores). The marker also
records every installed distribution and its version (the env's lock).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from repro.common.files import cache_dir, locked

MARKER_NAME = ".repro-env.json"
PIP_LOG_NAME = "pip-install.log"
COMPILE_LOG_NAME = "compileall.log"
_TAIL_LINES = 30


class HarnessEnvError(RuntimeError):
    """A harness environment could not be built."""


@dataclass(frozen=True)
class HarnessEnv:
    """A built harness environment: where it is and what it holds."""

    name: str
    version: str
    root: Path
    python: Path
    bin_dir: Path

    @property
    def site_packages(self) -> Path:
        """The env's ``site-packages`` folder."""
        return _site_packages(self.root)

    def version_of(self, package: str) -> str | None:
        """Installed version of ``package`` in this env, or None when it is absent."""
        wanted = _normalise(package)
        return installed_distributions(self.root).get(wanted)

    def script(self, name: str) -> Path:
        """Path of a console script installed in the env (e.g. ``mini``)."""
        return self.bin_dir / name


def env_root(name: str, version: str) -> Path:
    """Where the env for (name, version) lives."""
    return cache_dir() / "harness-envs" / f"{name}-{version}"


def build_hash(packages: list[str], python: str, remove: tuple[str, ...] = ()) -> str:
    """sha256 that identifies one build request (pinned packages + base interpreter, and the distributions
    uninstalled after the install, when any)."""
    request: dict = {"packages": list(packages), "python": os.path.realpath(python)}
    if remove:
        request["remove"] = sorted(remove)
    return hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()


def read_marker(root: Path) -> dict | None:
    """The env's marker as a dict, or None when absent or unreadable."""
    try:
        return json.loads((root / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return None


def is_valid(root: Path, expected_hash: str) -> bool:
    """True when the env at ``root`` is complete and was built for ``expected_hash``."""
    marker = read_marker(root)
    return bool(marker) and marker.get("sha256") == expected_hash and _env_python(root).exists()


def ensure_harness_env(
    name: str,
    version: str,
    packages: list[str],
    python: str = sys.executable,
    *,
    timeout_s: float = 1800.0,
    remove: tuple[str, ...] = (),
) -> HarnessEnv:
    """Return the cached env for (name, version), building it first if needed; ``remove``: distributions that the
    install pulls in and that must not be there (uninstalled before the marker is written)."""
    if not packages:
        raise ValueError("packages must name at least one pinned requirement")
    root = env_root(name, version)
    expected = build_hash(packages, python, remove)
    if not is_valid(root, expected):
        with locked(root.parent / f".{root.name}.lock"):  # one builder at a time
            if not is_valid(root, expected):
                _build(root, packages, python, expected, timeout_s, remove)
    return _as_env(name, version, root)


def installed_distributions(root: Path) -> dict[str, str]:
    """Normalised name -> version of every distribution installed in the env at ``root``."""
    site = _site_packages(root)
    dists = importlib.metadata.distributions(path=[str(site)])
    return {_normalise(d.metadata["Name"]): d.version for d in dists if d.metadata["Name"]}


def _as_env(name: str, version: str, root: Path) -> HarnessEnv:
    return HarnessEnv(name=name, version=version, root=root, python=_env_python(root), bin_dir=root / "bin")


def _build(root: Path, packages: list[str], python: str, expected: str, timeout_s: float,
           remove: tuple[str, ...] = ()) -> None:
    """Delete whatever is at ``root``, create the venv, install, then write the marker."""
    started = time.monotonic()
    print(f"building the {root.name} environment (first use on this machine, usually 1-3 minutes): "
          f"pip install {' '.join(packages)} -> {root}", flush=True)
    if root.exists():
        shutil.rmtree(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    own_pip = not _caller_has_pip()
    venv_cmd = [python, "-m", "venv", *([] if own_pip else ["--without-pip"]), str(root)]
    run_or_raise(venv_cmd, None, timeout_s, "venv creation")
    pip = [str(_env_python(root)), "-m", "pip"] if own_pip else _outer_pip(root)
    install = [*pip, "install", "--disable-pip-version-check", "--no-input", "--no-compile", *packages]
    run_or_raise(install, root / PIP_LOG_NAME, timeout_s, "pip install")
    if remove:
        run_or_raise([*pip, "uninstall", "--yes", *remove], root / "pip-uninstall.log", timeout_s, "pip uninstall")
    compile_bytecode(root, timeout_s)
    _write_marker(root, packages, python, expected, time.monotonic() - started)
    print(f"built {root.name} in {time.monotonic() - started:.0f}s", flush=True)


def compile_bytecode(root: Path, timeout_s: float) -> None:
    """Byte-compile the env's site-packages on every core (``compileall -j 0``), as pip would have one file after
    another (mini-SWE-agent's env: 9,845 files, 11 s on 2 cores against pip's ~20 s). A file that does not compile
    (a package's template or Python-2 fixture) is skipped, as pip skips it: the exit code is logged, not raised."""
    cmd = [str(_env_python(root)), "-m", "compileall", "-q", "-j", "0", str(_site_packages(root))]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise HarnessEnvError(f"byte-compiling {root} timed out after {timeout_s:.0f}s; retry with:\n"
                              f"  {shlex.join(cmd)}") from exc
    (root / COMPILE_LOG_NAME).write_text(f"exit {proc.returncode}\n{proc.stdout}{proc.stderr}")


def _outer_pip(root: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "--python", str(_env_python(root))]


def _caller_has_pip() -> bool:
    return importlib.util.find_spec("pip") is not None


def run_or_raise(cmd: list[str], log_path: Path | None, timeout_s: float, what: str, *,
                 env: Mapping[str, str] | None = None) -> None:
    """Run ``cmd`` (output saved to ``log_path`` if given) in this process's environment updated with ``env``;
    raise HarnessEnvError with tail + retry command."""
    full_env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **(env or {})}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=full_env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise HarnessEnvError(f"{what} timed out after {timeout_s:.0f}s; retry with:\n  {shlex.join(cmd)}") from exc
    output = proc.stdout + proc.stderr
    if log_path is not None:
        log_path.write_text(output)
    if proc.returncode != 0:
        tail = "\n".join(output.splitlines()[-_TAIL_LINES:])
        raise HarnessEnvError(
            f"{what} failed (exit {proc.returncode}); full log: {log_path or 'not kept'}\n"
            f"--- last {_TAIL_LINES} lines ---\n{tail}\n--- retry with ---\n  {shlex.join(cmd)}"
        )


def _write_marker(root: Path, packages: list[str], python: str, expected: str, seconds: float) -> None:
    marker = {
        "sha256": expected,
        "packages": list(packages),
        "python": os.path.realpath(python),
        "python_version": _python_version(root),
        "build_seconds": round(seconds, 2),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "installed": dict(sorted(installed_distributions(root).items())),
    }
    tmp = root / f"{MARKER_NAME}.tmp"
    tmp.write_text(json.dumps(marker, indent=2) + "\n")
    os.replace(tmp, root / MARKER_NAME)


def _env_python(root: Path) -> Path:
    return root / "bin" / "python"


def _site_packages(root: Path) -> Path:
    found = sorted(root.glob("lib/python*/site-packages"))
    if not found:
        raise HarnessEnvError(f"no site-packages under {root}")
    return found[0]


def _python_version(root: Path) -> str:
    return _site_packages(root).parent.name.removeprefix("python")


def _normalise(name: str) -> str:
    """PEP 503 name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()

"""What the cached npm installs of harnesses share (``opencode_env``, ``node_cli_env``): asking npm whether a
version exists (naming the versions near it when not), ``npm install`` into a prefix, and the env marker.

The marker protocol is ``repro.common.venvs``': an env is valid only with ``.repro-env.json`` carrying the sha256 of its
build request, written last and atomically, after everything was installed and checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from harness_adapters.versions import nearest
from repro.common.venvs import MARKER_NAME, HarnessEnvError, run_or_raise

NPM_FLAGS = ("--no-audit", "--no-fund", "--save-exact", "--loglevel=warn")


def request_sha256(request: Mapping[str, object]) -> str:
    """sha256 of a build request (a JSON-able mapping): the name of one build."""
    return hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()


def check_version_exists(package: str, version: str) -> None:
    """Raise HarnessEnvError naming ``package@version`` and the published versions near it when npm lacks it."""
    found = npm_json(["view", f"{package}@{version}", "version"])
    if found and not (isinstance(found, dict) and "error" in found):
        return
    listed = npm_json(["view", package, "versions"])
    versions = [str(v) for v in listed] if isinstance(listed, list) else []
    raise HarnessEnvError(f"{package}@{version} does not exist on npm; versions near it: "
                          f"{', '.join(nearest(version, frozenset(versions))) or 'none'}"
                          f"{f' (latest {versions[-1]})' if versions else ''}")


def npm_json(args: list[str]) -> object:
    """``npm <args> --json`` parsed (None when it printed nothing or no JSON); a 404 is an answer, not an error."""
    cmd = ["npm", *args, "--json"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HarnessEnvError(f"could not ask npm ({' '.join(cmd)}): {exc}") from exc
    if proc.returncode != 0 and "E404" not in proc.stdout + proc.stderr:
        raise HarnessEnvError(f"{' '.join(cmd)} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    try:
        return json.loads(proc.stdout) if proc.stdout.strip() else None
    except ValueError:
        return None


def npm_install(prefix: Path, packages: list[str], log_path: Path, timeout_s: float, *,
                flags: tuple[str, ...] = (), env: Mapping[str, str] | None = None) -> None:
    """``npm install --prefix <prefix> <packages>`` (exact versions saved), its output kept in ``log_path``."""
    cmd = ["npm", "install", *NPM_FLAGS, *flags, "--prefix", str(prefix), *packages]
    run_or_raise(cmd, log_path, timeout_s, f"npm install {' '.join(packages)}", env=env)


def write_marker(root: Path, request: Mapping[str, object], started: float, installed: Mapping[str, str]) -> None:
    """Write the marker that makes the env at ``root`` valid (last step of a build begun at ``started``)."""
    marker = {
        "sha256": request_sha256(request),
        "request": dict(request),
        "build_seconds": round(time.monotonic() - started, 2),
        "size_bytes": tree_size(root),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "installed": dict(installed),
    }
    tmp = root / f"{MARKER_NAME}.tmp"
    tmp.write_text(json.dumps(marker, indent=2) + "\n")
    os.replace(tmp, root / MARKER_NAME)


def tree_size(root: Path) -> int:
    """Bytes of the files under ``root`` (hard links counted once, links not followed)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total

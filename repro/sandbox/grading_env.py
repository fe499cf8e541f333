"""The interpreter that runs graded tests, pinned, and what the frozen spec records about it.

By default graded tests run in a cached environment of their own with a pinned pytest (built once under
``$REPRO_CACHE_DIR/harness-envs/grading-pytest-<version>``, like a harness env), not in the project's venv, where
pytest is only a dev extra and its version drifts. Tasks whose repositories need more (their own dependencies)
name an interpreter that has them in ``sandbox.python``. Either way the interpreter's version and its pytest's
version go into the frozen spec (:func:`grading_identity`), so runs graded differently never share a fingerprint.
"""

from __future__ import annotations

import functools
import json
import subprocess

GRADING_PYTEST = "9.2.0"
_PROBE = ("import json, platform, sys\n"
          "try:\n    import pytest; version = pytest.__version__\nexcept ImportError:\n    version = None\n"
          "print(json.dumps({'implementation': sys.implementation.name, 'python': platform.python_version(), "
          "'pytest': version}))")


def default_grading_python() -> str:
    """The pinned grading interpreter (its env is built on first use)."""
    from repro.common.venvs import ensure_harness_env

    return str(ensure_harness_env("grading-pytest", GRADING_PYTEST, [f"pytest=={GRADING_PYTEST}"]).python)


def grading_python(python: str | None) -> str:
    """``python`` when the config names one, else the pinned default."""
    return python or default_grading_python()


@functools.cache
def grading_identity(python: str) -> dict[str, str | None]:
    """``{"implementation", "python", "pytest"}`` of an interpreter (versions, no paths: machine-independent);
    ``{"error": ...}`` when it cannot be run."""
    try:
        proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60)
        return json.loads(proc.stdout) if proc.returncode == 0 else {"error": proc.stderr.strip()[-300:]}
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}

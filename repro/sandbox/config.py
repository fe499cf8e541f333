"""The local sandbox's settings (:class:`LocalSandboxConfig`, holding the process limits, :class:`ResourceLimits`)
and what an evaluation records about a sandbox (:class:`SandboxSpec`, part of the frozen evaluation spec, which imports
it from here: the sandbox describes itself and knows nothing of the spec)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from repro.common.dataclass_floats import coerce_floats
from repro.execution.limits import ResourceLimits

TEST_TIMEOUT_S = 120.0  # default wall-clock limit of one grading pytest run
__all__ = ["TEST_TIMEOUT_S", "LocalSandboxConfig", "ResourceLimits", "SandboxSpec"]


@dataclass
class LocalSandboxConfig:
    """Where repositories and workspaces live, and how graded tests run."""

    repos_dir: str = "repos"  # task repos resolve to <repos_dir>/<owner>__<name> unless the task has repo_path
    workspace_root: str | None = None  # None: a fresh temp dir per sandbox, removed by close()
    test_timeout_s: float = TEST_TIMEOUT_S  # wall-clock limit of one grading pytest run
    limits: ResourceLimits = field(default_factory=ResourceLimits)  # rlimits for commands and graded tests
    keep_workspaces: bool = False  # debugging: cleanup() and grading leave their directories behind
    python: str | None = None  # interpreter that runs the graded tests (None: the pinned grading env, see grading_env)
    fork_pytest: bool = True  # graded runs forked from a warm pytest server (pytest_server.py): same run, less CPU


@dataclass(frozen=True)
class SandboxSpec:
    """Where and how patches are graded, as the frozen spec records it. The limits are :class:`ResourceLimits`'
    (:meth:`of`), stored flat under the spec's own names (``cpu_time_s`` for ``cpu_s``): the fingerprint hashes this
    form, so it stays as it is."""

    kind: str = "local"
    test_timeout_s: float = TEST_TIMEOUT_S
    cpu_time_s: float = ResourceLimits.cpu_s
    memory_mb: int = ResourceLimits.memory_mb
    file_size_mb: int = ResourceLimits.file_size_mb
    settings: dict[str, Any] = field(default_factory=dict)  # e.g. docker image digests

    def __post_init__(self) -> None:
        coerce_floats(self, require_finite=True)

    @classmethod
    def of(cls, kind: str, test_timeout_s: float, limits: ResourceLimits,
           settings: dict[str, Any] | None = None) -> SandboxSpec:
        """The record of a sandbox that grades under ``limits`` (0 = not limited)."""
        return cls(kind, test_timeout_s, limits.cpu_s, limits.memory_mb, limits.file_size_mb, settings or {})

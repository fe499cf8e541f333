"""The local sandbox: per-rollout git working copies, commands as limited subprocesses, pytest grading.

Layout under the workspace root: ``<rollout_id>/`` (the working copy), ``.homes/<rollout_id>/`` (its commands'
HOME), ``grade-<instance_id>-*/`` (grading copies, removed after grading). Not an isolation boundary: commands run
as this user (rlimits, a clean environment, a private HOME and a timeout, but no filesystem or network isolation;
an agent can read other workspaces).
"""

from __future__ import annotations

import os
import re
import tempfile
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path

from repro.common.lifecycle import Closing
from repro.execution.limits import CommandResult, clean_env, run_limited
from repro.protocols import GradeResult, Workspace
from repro.sandbox.config import LocalSandboxConfig
from repro.sandbox.grading import grade_patch
from repro.sandbox.grading_env import grading_python
from repro.sandbox.repos import GitError, RepoResolver, diff_against, make_agent_copy, remove_tree
from repro.tasks.schema import Task

__all__ = ["LocalSandbox", "LocalSandboxConfig", "LocalWorkspace", "task_path"]


@dataclass
class LocalWorkspace:
    """A rollout's working copy of the base tree, with a private HOME for its commands. ``base_commit`` is the
    copy's own root commit (same tree as the task's ``base_commit``, none of its history)."""

    path: Path
    base_commit: str
    home: Path
    keep: bool = False
    command_env: dict[str, str] = field(default_factory=dict)  # the agent's commands: PATH led by the task's python

    def diff(self) -> str:
        """The working tree against ``base_commit``, new files included, binary-safe, ``git apply``-able."""
        return diff_against(self.path, self.base_commit)

    def cleanup(self) -> None:
        if not self.keep:
            remove_tree(self.path)
            remove_tree(self.home)


def task_path(python: str | None, path: str | None = None) -> str:
    """``path`` (default: this process's ``PATH``) led by the directory of ``python`` (unchanged without one)."""
    path = os.environ.get("PATH", os.defpath) if path is None else path
    if not python:
        return path
    first = str(Path(python).parent)
    return os.pathsep.join([first, *(d for d in path.split(os.pathsep) if d and d != first)])


def _dir_name(rollout_id: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]", "_", rollout_id).lstrip(".")
    if not name:
        raise ValueError(f"rollout id {rollout_id!r} gives no usable directory name")
    return name


class LocalSandbox(Closing):
    """Implements ``repro.protocols.Sandbox`` on this machine; safe to share between threads."""

    def __init__(self, config: LocalSandboxConfig | None = None) -> None:
        config = config or LocalSandboxConfig()
        self.config = replace(config, python=grading_python(config.python))
        self.resolver = RepoResolver(Path(self.config.repos_dir).expanduser())
        self._finalizer: weakref.finalize | None = None
        if self.config.workspace_root is None:
            self.root = Path(tempfile.mkdtemp(prefix="repro-workspaces-"))
            if not self.config.keep_workspaces:
                self._finalizer = weakref.finalize(self, remove_tree, self.root)
        else:
            self.root = Path(self.config.workspace_root).expanduser().resolve()
            self.root.mkdir(parents=True, exist_ok=True)

    def workspace(self, task: Task, rollout_id: str) -> LocalWorkspace:
        """A fresh working copy at ``<root>/<rollout_id>`` (a stale one of the same id is replaced).

        Raises ``RepoError`` (with the fix in its message) when the repository or base commit is missing.
        """
        repo, sha = self.resolver.resolve(task)
        name = _dir_name(rollout_id)
        path, home = self.root / name, self.root / ".homes" / name
        remove_tree(path)
        remove_tree(home)
        root_commit = make_agent_copy(repo, sha, path)  # the base tree and nothing of the repository's history
        home.mkdir(parents=True)
        return LocalWorkspace(path, root_commit, home, self.config.keep_workspaces, self.agent_env())

    def agent_env(self) -> dict[str, str]:
        """The agent's command environment: ``PATH`` led by the directory of the interpreter that grades the task
        (its ``python``, ``pytest``), then this process's ``PATH``. Without it ``python`` in an agent's command is
        whatever the host has first (a version manager's shim costs ~0.1 CPU-s a call here, and another machine
        may have another Python or none)."""
        return {"PATH": task_path(self.config.python)}

    def grade(self, task: Task, workspace: Workspace) -> GradeResult:
        """Grade the workspace's diff in a fresh copy (the agent's copy itself is never trusted)."""
        try:
            patch = workspace.diff()
        except (GitError, OSError) as exc:  # the agent broke its own working copy (e.g. removed .git)
            return GradeResult("unresolved", f"could not read the workspace's changes: {exc}")
        return self.grade_patch(task, patch)

    def grade_patch(self, task: Task, patch: str) -> GradeResult:
        """Grade a raw patch (e.g. the gold ``task.patch``, or "" for the empty patch)."""
        return grade_patch(task, patch, self.config, self.resolver, self.root)

    def run(self, workspace: Workspace, command: str, timeout_s: float) -> CommandResult:
        """``bash -c command`` in the workspace: clean env, rlimits, own process group killed on timeout."""
        home = workspace.home if isinstance(workspace, LocalWorkspace) else self.root / ".homes" / workspace.path.name
        home.mkdir(parents=True, exist_ok=True)
        return run_limited(["bash", "-c", command], workspace.path, clean_env(home, self.agent_env()), timeout_s,
                           self.config.limits)

    def close(self) -> None:
        """Remove the temp workspace root this sandbox made (unless ``keep_workspaces``)."""
        if self._finalizer is not None:
            self._finalizer()

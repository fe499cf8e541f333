"""Files of a task's repository at its base commit, read straight from git's objects (no working copy)."""

from __future__ import annotations

import subprocess
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from repro.tasks.schema import Task

__all__ = ["buggy_files", "read_blobs"]


def read_blobs(repo: Path, specs: list[str]) -> dict[str, str | None]:
    """``git cat-file --batch`` of ``<commit>:<path>`` specs: spec -> text (None when missing)."""
    if not specs:
        return {}
    proc = subprocess.run(["git", "-C", str(repo), "cat-file", "--batch"], input="\n".join(specs).encode() + b"\n",
                          capture_output=True, check=True)
    out, pos, blobs = proc.stdout, 0, {}
    for spec in specs:
        end = out.index(b"\n", pos)
        header = out[pos:end].split()
        if len(header) != 3:
            blobs[spec], pos = None, end + 1
            continue
        size = int(header[2])
        blobs[spec], pos = out[end + 1 : end + 1 + size].decode("utf-8", "replace"), end + 2 + size
    return blobs


def buggy_files(pairs: Iterable[tuple[Task, str]]) -> dict[tuple[str, str], str | None]:
    """(base_commit, path) -> text of ``path`` at the task's base commit (None when unreadable)."""
    by_repo: dict[str, set[tuple[str, str]]] = defaultdict(set)
    texts: dict[tuple[str, str], str | None] = {}
    for task, path in pairs:
        texts[(task.base_commit, path)] = None
        if task.repo_path:
            by_repo[task.repo_path].add((task.base_commit, path))
    for repo, keys in by_repo.items():
        ordered = sorted(keys)
        try:
            blobs = read_blobs(Path(repo), [f"{commit}:{path}" for commit, path in ordered])
        except (OSError, subprocess.CalledProcessError):
            continue
        texts.update({(commit, path): blobs.get(f"{commit}:{path}") for commit, path in ordered})
    return texts

"""The patch a rollout is graded on is the working tree's content, whatever git's stat cache says: a same-size edit
whose file keeps its old timestamps (an agent that sets mtime back, ``core.trustctime=false``, or an edit within the
checkout's timestamp) is in the patch, from the local sandbox's ``diff_against`` and from the docker sandbox's
``diff_command`` (run here with the same bash and git as in a container)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from repro.sandbox.docker import diff_command
from repro.sandbox.repos import diff_against


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True,
                          env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}).stdout


@pytest.fixture()
def edited(tmp_path: Path) -> tuple[Path, str]:
    """A repository whose ``calc.py`` changed ``-`` to ``+`` in place, with its mtime set back, and a new file."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "core.trustctime", "false")  # ctime is the only stat field the edit cannot set back
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    os.utime(repo / "calc.py", (1_000_000_000, 1_000_000_000))  # older than the index: not racily clean
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "status", "--porcelain")  # refresh the index: its entry now caches calc.py's stat
    before = os.stat(repo / "calc.py")
    with open(repo / "calc.py", "r+") as handle:  # same inode, same size
        handle.write("def add(a, b):\n    return a + b\n")
    os.utime(repo / "calc.py", ns=(before.st_atime_ns, before.st_mtime_ns))
    (repo / "new.py").write_text("X = 1\n")
    assert git(repo, "diff", "--stat") == "", "the staging failed: git's stat cache still sees the edit"
    return repo, base


def test_the_local_diff_sees_an_edit_the_stat_cache_hides(edited) -> None:
    repo, base = edited
    patch = diff_against(repo, base)
    assert "+    return a + b" in patch and "-    return a - b" in patch and "+X = 1" in patch


def test_the_container_diff_command_sees_an_edit_the_stat_cache_hides(edited) -> None:
    repo, base = edited
    run = subprocess.run(["bash", "-c", diff_command(base)], cwd=repo, capture_output=True, text=True, check=True)
    assert "+    return a + b" in run.stdout and "+X = 1" in run.stdout
    assert git(repo, "diff", "--cached", "--stat") == "", "the agent's own index was changed"

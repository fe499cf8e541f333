"""Task repositories: deterministic shas, idempotent and additive builds, safe under concurrent builders."""

from __future__ import annotations

import multiprocessing
import subprocess
from pathlib import Path

import pytest

from repro.tasks import materialize as mat
from repro.tasks.materialize import CommitSpec, materialize, repo_dir

CLEAN = CommitSpec("refs/heads/main", {"pkg/mod.py": "x = 1\n", "tests/test_mod.py": "def test(): pass\n"}, None)
TASK = CommitSpec("refs/tasks/t1", {"pkg/mod.py": "x = 2\n"}, "refs/heads/main")


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def git(path: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=path, capture_output=True, text=True, check=True).stdout.strip()


def test_layout_and_parentage(cache: Path):
    path, shas = materialize("demo", [CLEAN, TASK])
    assert path == cache / "repos" / "repro-bundled__demo" == repo_dir("demo")
    assert git(path, "rev-parse", "refs/tasks/t1") == shas["refs/tasks/t1"]
    assert git(path, "rev-parse", "refs/tasks/t1^") == shas["refs/heads/main"]
    assert git(path, "show", "refs/tasks/t1:pkg/mod.py") == "x = 2"
    assert git(path, "show", "refs/tasks/t1:tests/test_mod.py") == "def test(): pass"
    identity = git(path, "log", "-1", "--format=%an %ae %at %cn %ct", "refs/tasks/t1")
    assert identity == "repro tasks tasks@repro.invalid 946684800 repro tasks 946684800"


def test_shas_are_the_same_in_another_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    _, first = materialize("demo", [CLEAN, TASK])
    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path / "elsewhere"))
    _, second = materialize("demo", [CLEAN, TASK])
    assert first == second


def test_second_build_is_a_no_op(monkeypatch: pytest.MonkeyPatch):
    _, first = materialize("demo", [CLEAN, TASK])
    monkeypatch.setattr(mat, "_git", lambda *a, **k: pytest.fail("git ran for an already built input"))
    assert materialize("demo", [CLEAN, TASK])[1] == first


def test_new_inputs_are_added_and_old_refs_kept():
    path, first = materialize("demo", [CLEAN, TASK])
    task2 = CommitSpec("refs/tasks/t2", {"pkg/mod.py": "x = 3\n"}, "refs/heads/main")
    _, second = materialize("demo", [CLEAN, task2])
    assert second["refs/heads/main"] == first["refs/heads/main"]
    assert git(path, "rev-parse", "refs/tasks/t1") == first["refs/tasks/t1"]
    assert git(path, "rev-parse", "refs/tasks/t2") == second["refs/tasks/t2"]


def test_parent_must_come_first():
    with pytest.raises(ValueError, match="parent 'refs/heads/main' must come earlier"):
        materialize("demo", [TASK, CLEAN])


def _build(_: int) -> dict[str, str]:
    specs = [CLEAN] + [CommitSpec(f"refs/tasks/t{i}", {"pkg/mod.py": f"x = {i}\n"}, "refs/heads/main")
                       for i in range(200)]
    return materialize("race", specs)[1]


def test_concurrent_builders_agree(cache: Path):
    # spawn, not fork: earlier tests leave threads (tqdm's monitor, servers) whose locks a forked child can inherit
    # held; one such child hung the suite until the 600 s timeout
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        results = pool.map(_build, range(3))
    assert results[0] == results[1] == results[2]
    path = repo_dir("race")
    assert git(path, "fsck", "--no-progress") == ""
    assert len(git(path, "for-each-ref", "refs/tasks").splitlines()) == 200

"""The history scrub (``repro/sandbox/history.py``) on real git repositories here (the script the docker sandbox runs
in a rollout's container), and its wiring into the docker sandbox's set-up command and patch base."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness_adapters.mini_swe_agent.worker import run_startup_command
from repro.protocols import ContainerSpec
from repro.sandbox.docker import DockerSandbox, DockerSandboxConfig, diff_command
from repro.sandbox.history import BASE_REF, SCRUB_FAILED, scrub_command
from repro.sandbox.images import TaskImage
from repro.sandbox.repos import GIT_ENV, SourceRepo, git, make_agent_copy
from repro.tasks.schema import Task
from repro.tasks.swesmith import SCHEMA, SCHEMA_KEY
from tests.support import commit_all


def scrub(repo: Path, branch: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", scrub_command(branch)], cwd=repo, capture_output=True, text=True,
                          env={**GIT_ENV, "HOME": str(repo.parent)})


def busy_repo(path: Path, n_commits: int, future: int, detached: bool) -> str:
    """A repository with ``n_commits`` on main, ``future`` more on a branch, a tag, a stash, a remote, a packed ref,
    a dangling commit and an alternate object store; HEAD at main's last commit (detached or on ``main``)."""
    path.mkdir(parents=True)
    git(["init", "-q", "-b", "main"], path)
    for i in range(n_commits):
        (path / "f.txt").write_text(f"state {i}\n")
        commit_all(path, f"c{i}")
    head = git(["rev-parse", "HEAD"], path).stdout.strip()
    git(["tag", "-a", "-m", "t", "v0", head], path)
    git(["checkout", "-q", "-b", "future"], path)
    for i in range(future):
        (path / "f.txt").write_text(f"future FIX {i}\n")
        commit_all(path, f"future {i}")
    git(["checkout", "-q", "main"], path)
    git(["tag", "future-tag", "future"], path)
    (path / "f.txt").write_text("stashed FIX\n")
    git(["stash", "-q"], path)
    dangling = git(["commit-tree", "HEAD^{tree}", "-m", "dangling FIX"], path).stdout.strip()
    git(["update-ref", "refs/original/x", dangling], path)
    git(["pack-refs", "--all"], path)
    git(["update-ref", "-d", "refs/original/x"], path)
    git(["remote", "add", "origin", "https://example.invalid/x.git"], path)
    other = path.parent / f"{path.name}-alt"
    git(["init", "-q", "--bare", str(other)], path.parent)
    (path / ".git/objects/info/alternates").write_text(f"{other}/objects\n")
    if detached:
        git(["checkout", "-q", "--detach"], path)
    return git(["rev-parse", "HEAD^{tree}"], path).stdout.strip()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_commits=st.integers(1, 4), future=st.integers(0, 3), detached=st.booleans(), dirty=st.booleans())
def test_only_one_root_commit_of_the_tree_survives(tmp_path_factory, n_commits: int, future: int, detached: bool,
                                                   dirty: bool) -> None:
    repo = tmp_path_factory.mktemp("r") / "repo"
    tree = busy_repo(repo, n_commits, future, detached)
    if dirty:
        (repo / "new.txt").write_text("untracked\n")
    done = scrub(repo)
    assert done.returncode == 0, done.stderr
    root = done.stdout.split()[-1]
    assert git(["rev-list", "--all", "--reflog"], repo).stdout.split() == [root]
    assert git(["rev-parse", f"{root}^{{tree}}", BASE_REF], repo).stdout.split() == [tree, root]
    objects = git(["cat-file", "--batch-all-objects", "--batch-check=%(objectname)"], repo).stdout.split()
    reachable = git(["rev-list", "--objects", root], repo).stdout.split()
    assert sorted(objects) == sorted(o for o in reachable if len(o) == 40)
    assert "FIX" not in git(["cat-file", "--batch-all-objects", "--batch"], repo).stdout
    assert git(["for-each-ref", "--format=%(refname)"], repo).stdout.split() == \
        ([BASE_REF] if detached else ["refs/heads/main", BASE_REF])
    for empty in (["tag"], ["stash", "list"], ["reflog"], ["remote"], ["fsck", "--unreachable", "--no-reflogs"]):
        assert git(empty, repo).stdout.strip() == "", empty
    assert not (repo / ".git/objects/info/alternates").exists() and not (repo / ".git/packed-refs").exists()
    assert git(["status", "--porcelain"], repo).stdout == ("?? new.txt\n" if dirty else "")


def test_the_root_commit_is_the_local_agent_copys_and_scrubbing_is_idempotent(tmp_path: Path) -> None:
    tree = busy_repo(tmp_path / "repo", 2, 1, detached=True)
    first = scrub(tmp_path / "repo").stdout.split()[-1]
    again = scrub(tmp_path / "repo").stdout.split()[-1]
    head = git(["rev-parse", "HEAD"], tmp_path / "repo").stdout.strip()
    local = make_agent_copy(SourceRepo(tmp_path / "repo", tmp_path / "repo/.git/objects"), head, tmp_path / "copy")
    assert first == again == local
    assert git(["rev-parse", f"{first}^{{tree}}"], tmp_path / "repo").stdout.strip() == tree


def test_the_named_branch_replaces_the_one_head_was_on(tmp_path: Path) -> None:
    busy_repo(tmp_path / "repo", 2, 0, detached=False)
    git(["checkout", "-q", "-b", "owner__name.abc.func_pm_remove_cond__x"], tmp_path / "repo")
    assert scrub(tmp_path / "repo", "main").returncode == 0
    assert git(["symbolic-ref", "HEAD"], tmp_path / "repo").stdout.strip() == "refs/heads/main"
    assert git(["branch", "-a"], tmp_path / "repo").stdout.strip() == "* main"


def test_the_agents_patch_is_taken_against_the_base_even_after_it_commits(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    busy_repo(repo, 1, 1, detached=False)
    scrub(repo)
    (repo / "f.txt").write_text("edited\n")
    commit_all(repo, "the agent's own commit")
    (repo / "g.txt").write_text("new\n")
    patch = subprocess.run(["bash", "-c", diff_command(BASE_REF)], cwd=repo, capture_output=True, text=True,
                           env=GIT_ENV).stdout
    assert "+edited" in patch and "+new" in patch and "b/g.txt" in patch


def test_a_failing_scrub_says_what_failed_and_how_to_turn_it_off(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    done = scrub(tmp_path / "plain")
    assert done.returncode == 1
    assert SCRUB_FAILED in done.stderr and "not a git working tree" in done.stderr
    assert "sandbox.scrub_history=false" in done.stderr


class _NoEngine:
    """Stands in for the docker client: these tests never reach it (``image`` is replaced)."""


def _sandbox(monkeypatch: pytest.MonkeyPatch, **config: object) -> DockerSandbox:
    box = DockerSandbox(DockerSandboxConfig(run_id="t", **config), engine=_NoEngine())
    monkeypatch.setattr(box, "image", lambda task: TaskImage(task.instance_id, "img", "abc123"))
    return box


TASK = Task(instance_id="o__n.1234abcd.func_pm_x__1", repo="swesmith/o__n.1234abcd", base_commit="b",
            problem_statement="p", extra={SCHEMA_KEY: SCHEMA, "image_name": "img"})


def test_rollout_containers_are_checked_out_then_scrubbed_and_diffed_against_the_base_ref(monkeypatch) -> None:
    box = _sandbox(monkeypatch)
    spec = box.workspace(TASK, "r1").container_spec
    assert spec.startup_command.startswith(f"git checkout -q -f {TASK.instance_id} || exit 1\n")
    assert spec.startup_command.endswith(scrub_command("main"))
    assert spec.startup_timeout_s == 300.0 and spec.diff_command == diff_command(BASE_REF)
    bench = Task(instance_id="a__b-1", repo="a/b", base_commit="abc123", problem_statement="p")
    assert box.setup_command(bench) == scrub_command(None)


def test_without_the_scrub_the_image_history_and_base_commit_stay(monkeypatch) -> None:
    box = _sandbox(monkeypatch, scrub_history=False)
    spec = box.workspace(TASK, "r1").container_spec
    assert spec.startup_command == f"git checkout -q -f {TASK.instance_id}"
    assert spec.diff_command == diff_command("abc123")
    bench = Task(instance_id="a__b-1", repo="a/b", base_commit="abc123", problem_statement="p")
    assert box.setup_command(bench) == ""


def test_the_harness_worker_bounds_the_startup_command_by_its_own_timeout() -> None:
    calls = []

    class Env:
        def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict:
            calls.append((action["command"], timeout))
            return {"returncode": 0, "output": ""}

    spec = ContainerSpec("img", "/testbed", [], "diff", 60.0, "setup", 300.0)
    run_startup_command(Env(), spec.startup_command, spec.startup_timeout_s)
    run_startup_command(Env(), "other")
    assert calls == [("setup", 300), ("other", None)]

"""Local sandbox: repository resolution, workspaces, diffs and sandboxed commands, on a tiny git repo."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from repro.execution.limits import ResourceLimits
from repro.sandbox.local import LocalSandbox, LocalSandboxConfig, task_path
from repro.sandbox.repos import RepoError, git, repo_location
from repro.tasks.schema import Task
from tests.support import CALC, calc_task, commit_all, make_calc_repo, make_sandbox


@pytest.fixture(scope="module")
def calc_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str, str, str]:
    repos = tmp_path_factory.mktemp("repos")
    return (repos, *make_calc_repo(repos / "acme__calc"))


@pytest.fixture
def task(calc_repo) -> Task:
    return calc_task(*calc_repo)


@pytest.fixture
def sandbox(calc_repo, tmp_path: Path) -> LocalSandbox:
    return make_sandbox(calc_repo[0], tmp_path / "ws")


def test_repo_location_forms(tmp_path: Path) -> None:
    task = Task(instance_id="i", repo="acme/calc", base_commit="abc", problem_statement="p")
    assert repo_location(task, tmp_path) == tmp_path / "acme__calc"
    assert repo_location(replace(task, repo_path="/x/y"), tmp_path) == Path("/x/y")
    assert repo_location(replace(task, repo_path="file:///x/a%20b"), tmp_path) == Path("/x/a b")
    assert repo_location(replace(task, repo_path="mine/calc"), tmp_path) == tmp_path / "mine/calc"
    with pytest.raises(RepoError, match=r"git clone https://example\.com/calc\.git"):
        repo_location(replace(task, repo_path="https://example.com/calc.git"), tmp_path)


def test_workspace_is_a_clean_git_copy_at_base(sandbox: LocalSandbox, task: Task) -> None:
    ws = sandbox.workspace(task, "rollout/1")
    assert ws.path == sandbox.root / "rollout_1"
    assert (ws.path / "calc.py").read_text() == CALC
    tree = git(["rev-parse", "HEAD^{tree}"], ws.path).stdout.strip()
    source = sandbox.resolver.resolve(task)[0].path
    assert tree == git(["rev-parse", f"{task.base_commit}^{{tree}}"], source).stdout.strip()
    assert git(["status", "--porcelain"], ws.path).stdout == ""
    assert git(["log", "--all", "--format=%s"], ws.path).stdout.split("\n")[:-1] == ["base"]
    assert ws.diff() == ""
    ws.cleanup()
    assert not ws.path.exists() and not ws.home.exists()


def test_workspace_repo_path_overrides_repos_dir(sandbox: LocalSandbox, task: Task, calc_repo) -> None:
    moved = replace(task, repo="other/name", repo_path=f"file://{calc_repo[0] / 'acme__calc'}")
    assert (sandbox.workspace(moved, "r").path / "calc.py").exists()


def test_diff_has_edits_new_and_binary_files_and_applies_on_base(sandbox: LocalSandbox, task: Task) -> None:
    ws = sandbox.workspace(task, "agent")
    (ws.path / "calc.py").write_text(CALC.replace("a - b", "a + b"))
    (ws.path / "pkg").mkdir()
    (ws.path / "pkg/new.py").write_text("VALUE = 1\n")
    (ws.path / "blob.bin").write_bytes(bytes(range(256)) * 4)
    (ws.path / "README").unlink()
    (ws.path / "__pycache__").mkdir()
    (ws.path / "__pycache__/calc.cpython-311.pyc").write_bytes(b"\0junk")
    git(["add", "calc.py"], ws.path)  # whatever the agent staged stays staged
    patch = ws.diff()
    assert "pkg/new.py" in patch and "GIT binary patch" in patch and "deleted file" in patch
    assert "__pycache__" not in patch
    assert git(["diff", "--cached", "--name-only"], ws.path).stdout == "calc.py\n"  # agent's index untouched

    fresh = sandbox.workspace(task, "fresh")
    git(["apply", "-"], fresh.path, stdin=patch)
    for name in ("calc.py", "pkg/new.py", "blob.bin"):
        assert (fresh.path / name).read_bytes() == (ws.path / name).read_bytes()
    assert not (fresh.path / "README").exists()


def test_diff_is_against_base_even_after_agent_commits(sandbox: LocalSandbox, task: Task) -> None:
    ws = sandbox.workspace(task, "committer")
    (ws.path / "calc.py").write_text("changed\n")
    commit_all(ws.path, "agent commit")  # the workspace carries its own identity
    assert "+changed" in ws.diff()


def test_workspaces_are_independent(sandbox: LocalSandbox, task: Task) -> None:
    one, two = sandbox.workspace(task, "one"), sandbox.workspace(task, "two")
    (one.path / "calc.py").write_text("broken\n")
    assert two.diff() == "" and (two.path / "calc.py").read_text() == CALC
    one.cleanup()
    assert (two.path / "calc.py").read_text() == CALC and git(["status", "--porcelain"], two.path).stdout == ""


def test_stale_workspace_of_same_rollout_is_replaced(sandbox: LocalSandbox, task: Task) -> None:
    first = sandbox.workspace(task, "again")
    (first.path / "leftover.txt").write_text("x")
    second = sandbox.workspace(task, "again")
    assert not (second.path / "leftover.txt").exists() and second.diff() == ""


def test_workspace_creation_is_cheap(sandbox: LocalSandbox, task: Task) -> None:
    sandbox.workspace(task, "warm")
    started = time.perf_counter()
    for i in range(10):
        sandbox.workspace(task, f"timed-{i}")
    assert (time.perf_counter() - started) / 10 < 0.1  # measured ~4-5 ms here


def test_missing_repo_error_names_path_and_clone_command(sandbox: LocalSandbox, task: Task) -> None:
    with pytest.raises(RepoError) as info:
        sandbox.workspace(replace(task, repo="acme/absent"), "r")
    expected = Path(sandbox.config.repos_dir) / "acme__absent"
    assert str(expected) in str(info.value)
    assert f"git clone https://github.com/acme/absent {expected}" in str(info.value)


def test_directory_that_is_not_a_repo_is_rejected(sandbox: LocalSandbox, task: Task, tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    with pytest.raises(RepoError, match="not a git repository"):
        sandbox.workspace(replace(task, repo_path=str(tmp_path / "plain")), "r")


def test_missing_commit_error(sandbox: LocalSandbox, task: Task) -> None:
    with pytest.raises(RepoError, match=r"base_commit 0123456789abcdef is not in .*acme__calc.*fetch"):
        sandbox.workspace(replace(task, base_commit="0123456789abcdef"), "r")


def test_run_in_workspace(sandbox: LocalSandbox, task: Task) -> None:
    ws = sandbox.workspace(task, "cmd")
    result = sandbox.run(ws, "pwd; echo hi > made.txt; echo $HOME; exit 3", timeout_s=10)
    lines = result.output.split()
    assert result.exit_code == 3 and not result.timed_out
    assert lines[0] == str(ws.path) and lines[1] == str(ws.home)
    assert "made.txt" in ws.diff()


def test_commands_see_no_secrets(sandbox: LocalSandbox, task: Task, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake-secret")
    result = sandbox.run(sandbox.workspace(task, "env"), "env", timeout_s=10)
    assert result.exit_code == 0 and "PATH=" in result.output
    assert "OPENAI_API_KEY" not in result.output and "sk-fake-secret" not in result.output


def test_the_agents_python_is_the_task_interpreter(sandbox: LocalSandbox, task: Task) -> None:
    """A workspace's command environment leads PATH with the grading interpreter's directory (the task's python),
    and sandboxed commands resolve ``python`` there, whatever the host has first on its PATH."""
    ws = sandbox.workspace(task, "py")
    first = ws.command_env["PATH"].split(os.pathsep)[0]
    assert first == str(Path(sandbox.config.python).parent)
    result = sandbox.run(ws, "command -v python", timeout_s=10)
    assert result.output.strip() == str(Path(first) / "python")


def test_task_path_leads_with_the_interpreter_once() -> None:
    assert task_path("/opt/py/bin/python3", "/usr/bin:/opt/py/bin:/bin") == "/opt/py/bin:/usr/bin:/bin"
    assert task_path(None, "/usr/bin") == "/usr/bin"


def test_timeout_kills_the_process_group(sandbox: LocalSandbox, task: Task) -> None:
    ws = sandbox.workspace(task, "slow")
    started = time.monotonic()
    result = sandbox.run(ws, "(sleep 30; echo late) & sleep 30", timeout_s=0.5)
    assert result.timed_out and time.monotonic() - started < 5
    assert "late" not in result.output


def test_memory_rlimit_stops_a_command(calc_repo, task: Task, tmp_path: Path) -> None:
    sandbox = make_sandbox(calc_repo[0], tmp_path, limits=ResourceLimits(memory_mb=300))
    hog = ("import sys\nchunks = []\ntry:\n    while True:\n        chunks.append(bytearray(10_000_000))\n"
           "except MemoryError:\n    print('stopped at', len(chunks) * 10, 'MB'); sys.exit(7)\n")
    (tmp_path / "hog.py").write_text(hog)
    result = sandbox.run(sandbox.workspace(task, "hog"), f"python {tmp_path / 'hog.py'}", timeout_s=30)
    assert result.exit_code == 7, result.output
    assert int(result.output.split()[2]) <= 300


def test_default_root_is_a_temp_dir_removed_by_close(calc_repo, task: Task) -> None:
    sandbox = LocalSandbox(LocalSandboxConfig(repos_dir=str(calc_repo[0])))
    ws = sandbox.workspace(task, "tmp")
    assert ws.path.is_dir()
    sandbox.close()
    assert not sandbox.root.exists()


def test_workspace_holds_nothing_of_the_repository_history(tmp_path: Path) -> None:
    """A task repo as users make them: the bug-introducing commit, then the fix, on main. The agent's copy must
    hold the base tree and nothing else: no log, no refs, and no object (borrowed or not) with the fix."""
    repo = tmp_path / "repos" / "acme__hist"
    repo.mkdir(parents=True)
    git(["init", "-q", "-b", "main"], repo)
    (repo / "calc.py").write_text(CALC.replace("a - b", "a + b"))
    commit_all(repo, "working add")
    (repo / "calc.py").write_text(CALC)
    base = commit_all(repo, "introduce the bug")
    fixed_line = "return a + b  # FIXED-MARKER"
    (repo / "calc.py").write_text(CALC.replace("return a - b", fixed_line))
    commit_all(repo, "fix add")
    git(["gc", "-q"], repo)  # objects packed, as in a cloned repository
    task = Task(instance_id="acme__hist-1", repo="acme/hist", base_commit=base, problem_statement="add() subtracts")
    ws = make_sandbox(tmp_path / "repos", tmp_path / "ws").workspace(task, "leak")
    assert (ws.path / "calc.py").read_text() == CALC
    assert git(["log", "--all", "--format=%s"], ws.path).stdout.split() == ["base"]
    assert git(["diff", "HEAD", "HEAD~1"], ws.path, check=False).returncode != 0  # no parent to diff with
    assert not (ws.path / ".git/objects/info/alternates").exists()
    objects = git(["cat-file", "--batch-all-objects", "--batch-check=%(objectname)"], ws.path).stdout.split()
    contents = git(["cat-file", "--batch"], ws.path, stdin="\n".join(objects) + "\n").stdout
    assert len(objects) == 3  # the root commit, its tree, the one blob of calc.py
    assert "a + b" not in contents and "FIXED-MARKER" not in contents and "introduce the bug" not in contents
    assert git(["fsck", "--no-progress"], ws.path).returncode == 0
    (ws.path / "calc.py").write_text(CALC.replace("a - b", "a + b"))
    assert "+    return a + b" in ws.diff()  # the agent's diff is still against the base tree

"""Local sandbox grading: outcomes for gold, empty, broken and cheating patches; timeouts, rlimits, errors."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from repro.execution import pytest_runner
from repro.execution.limits import ResourceLimits
from repro.sandbox.grading import decide, protected_paths
from repro.sandbox.local import LocalSandbox
from repro.tasks.schema import Task
from tests.support import CALC, calc_task, make_calc_repo, make_sandbox

F2P, MUL, ENV = "tests/test_calc.py::test_add", "tests/test_calc.py::test_mul", "tests/test_calc.py::test_no_secrets"


@pytest.fixture(scope="module")
def calc_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str, str, str]:
    repos = tmp_path_factory.mktemp("repos")
    return (repos, *make_calc_repo(repos / "acme__calc"))


@pytest.fixture
def task(calc_repo) -> Task:
    return calc_task(*calc_repo)


@pytest.fixture
def sandbox(calc_repo, tmp_path: Path) -> LocalSandbox:
    return make_sandbox(calc_repo[0], tmp_path)


def new_file_patch(path: str, text: str) -> str:
    lines = text.splitlines()
    body = "".join(f"+{line}\n" for line in lines)
    return (f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
            f"@@ -0,0 +1,{len(lines)} @@\n{body}")


def agent_patch(sandbox: LocalSandbox, task: Task, files: dict[str, str]) -> str:
    """The diff of a workspace after writing ``files`` into it (as an agent would)."""
    ws = sandbox.workspace(task, "agent")
    for name, text in files.items():
        (ws.path / name).write_text(text)
    patch = ws.diff()
    ws.cleanup()
    return patch


def test_gold_patch_resolves_without_secrets(sandbox: LocalSandbox, task: Task,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake")  # test_no_secrets (a PASS_TO_PASS) would fail if it leaked
    result = sandbox.grade_patch(task, task.patch)
    assert result.outcome == "resolved", (result.reason, result.log_tail)
    assert result.tests == {F2P: "PASSED", MUL: "PASSED", ENV: "PASSED"}
    assert "passed" in result.log_tail and result.duration_s > 0
    assert list(sandbox.root.iterdir()) == []  # the grading copy is gone


def test_empty_patch_is_unresolved(sandbox: LocalSandbox, task: Task) -> None:
    result = sandbox.grade_patch(task, "")
    assert result.outcome == "unresolved"
    assert result.reason.startswith("empty patch") and F2P in result.reason
    assert result.tests == {F2P: "FAILED", MUL: "PASSED", ENV: "PASSED"}


def test_workspace_fix_resolves(sandbox: LocalSandbox, task: Task) -> None:
    ws = sandbox.workspace(task, "solver")
    (ws.path / "calc.py").write_text(CALC.replace("a - b", "a + b"))
    assert sandbox.grade(task, ws).outcome == "resolved"


def test_breaking_pass_to_pass_is_unresolved(sandbox: LocalSandbox, task: Task) -> None:
    patch = agent_patch(sandbox, task, {"calc.py": CALC.replace("a - b", "a + b").replace("a * b", "a + b")})
    result = sandbox.grade_patch(task, patch)
    assert result.outcome == "unresolved" and result.tests[F2P] == "PASSED" and result.tests[MUL] == "FAILED"
    assert "PASS_TO_PASS not passing (1/2): tests/test_calc.py::test_mul" in result.reason


def test_patch_that_does_not_apply_is_unresolved(sandbox: LocalSandbox, task: Task) -> None:
    result = sandbox.grade_patch(task, task.patch.replace("return a - b", "return a / b"))
    assert (result.outcome, result.reason) == ("unresolved", "patch does not apply")
    assert "patch failed" in result.log_tail and result.tests == {}


def test_syntax_error_is_the_agents_fault(sandbox: LocalSandbox, task: Task) -> None:
    result = sandbox.grade_patch(task, agent_patch(sandbox, task, {"calc.py": "def add(a, b)\n"}))
    assert result.outcome == "unresolved"
    assert "could not collect" in result.reason and set(result.tests.values()) == {"MISSING"}


def test_agent_edits_to_tests_do_not_count(sandbox: LocalSandbox, task: Task) -> None:
    # the agent "adds" test_add as a no-op and breaks test_mul's assertion instead of fixing add()
    cheat = {"tests/test_calc.py": "from calc import mul\n\ndef test_add():\n    pass\n\ndef test_mul():\n    pass\n"}
    result = sandbox.grade_patch(task, agent_patch(sandbox, task, cheat))
    assert result.outcome == "unresolved" and result.tests[F2P] == "FAILED"
    # with a real fix next to the test edits the test edits are dropped, not a reason to fail
    fixed = {**cheat, "calc.py": CALC.replace("a - b", "a + b")}
    assert sandbox.grade_patch(task, agent_patch(sandbox, task, fixed)).outcome == "resolved"


def test_patch_cannot_replace_the_test_runner(sandbox: LocalSandbox, task: Task) -> None:
    fake = "print('PASSED tests/test_calc.py::test_add')\nprint('PASSED tests/test_calc.py::test_mul')\n"
    result = sandbox.grade_patch(task, agent_patch(sandbox, task, {"pytest.py": fake}))
    assert result.outcome == "unresolved" and result.tests[F2P] == "FAILED"


def test_graded_test_files_are_protected_without_test_patch(sandbox: LocalSandbox, task: Task, calc_repo) -> None:
    at_tests = replace(task, base_commit=calc_repo[2], test_patch="")  # test_add already in the repo
    assert sandbox.grade_patch(at_tests, at_tests.patch).outcome == "resolved"
    cheat = agent_patch(sandbox, at_tests, {"tests/test_calc.py": "def test_add():\n    pass\n"})
    assert sandbox.grade_patch(at_tests, cheat).outcome == "unresolved"


def test_protected_paths_cover_test_patch_and_graded_files(task: Task) -> None:
    extra = new_file_patch("tests/test_new.py", "x = 1\n")
    assert protected_paths(replace(task, test_patch=task.test_patch + extra, PASS_TO_PASS=["t/b.py::x"])) == (
        "t/b.py", "tests/test_calc.py", "tests/test_new.py")


def test_test_patch_that_does_not_apply_is_an_error(sandbox: LocalSandbox, task: Task) -> None:
    result = sandbox.grade_patch(replace(task, test_patch=task.patch.replace("a - b", "a // b")), task.patch)
    assert result.outcome == "error" and "test_patch does not apply" in result.reason


def test_missing_repo_or_commit_is_an_error(sandbox: LocalSandbox, task: Task) -> None:
    missing = sandbox.grade_patch(replace(task, repo="acme/absent"), task.patch)
    assert missing.outcome == "error" and "git clone https://github.com/acme/absent" in missing.reason
    no_commit = sandbox.grade_patch(replace(task, base_commit="feedface"), task.patch)
    assert no_commit.outcome == "error" and "base_commit feedface is not in" in no_commit.reason


def test_task_without_fail_to_pass_is_an_error(sandbox: LocalSandbox, task: Task) -> None:
    assert sandbox.grade_patch(replace(task, FAIL_TO_PASS=[]), task.patch).outcome == "error"


def test_missing_interpreter_is_an_error(calc_repo, task: Task, tmp_path: Path) -> None:
    result = make_sandbox(calc_repo[0], tmp_path, python="/no/python").grade_patch(task, task.patch)
    assert result.outcome == "error" and "/no/python" in result.reason


def test_interpreter_without_pytest_is_an_error(calc_repo, task: Task, tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    result = make_sandbox(calc_repo[0], tmp_path, python=str(tmp_path / "bare/bin/python")).grade_patch(task, "")
    assert result.outcome == "error" and "pytest is not installed" in result.reason


def with_test(task: Task, name: str, body: str) -> Task:
    """``task`` whose test_patch adds ``tests/<name>.py`` holding the single FAIL_TO_PASS test ``test_it``."""
    return replace(task, test_patch=new_file_patch(f"tests/{name}.py", body),
                   FAIL_TO_PASS=[f"tests/{name}.py::test_it"], PASS_TO_PASS=[])


def test_slow_tests_time_out(calc_repo, task: Task, tmp_path: Path) -> None:
    slow = with_test(task, "test_slow", "import time\n\ndef test_it():\n    time.sleep(60)\n")
    result = make_sandbox(calc_repo[0], tmp_path, test_timeout_s=1.5).grade_patch(slow, "")
    assert result.outcome == "timeout" and result.duration_s < 10


def test_cpu_limit_is_a_timeout(calc_repo, task: Task, tmp_path: Path) -> None:
    sandbox = make_sandbox(calc_repo[0], tmp_path, limits=ResourceLimits(cpu_s=1), keep_workspaces=True)
    result = sandbox.grade_patch(with_test(task, "test_spin", "def test_it():\n    while True:\n        pass\n"), "")
    assert result.outcome == "timeout" and "CPU" in result.reason and result.duration_s < 10
    assert list(tmp_path.glob("grade-*/tests/test_spin.py")) and not list(tmp_path.rglob("core*"))  # kept copy


def test_memory_hog_is_stopped_by_rlimit(calc_repo, task: Task, tmp_path: Path) -> None:
    sandbox = make_sandbox(calc_repo[0], tmp_path, limits=ResourceLimits(memory_mb=400))
    hog = ("def test_it():\n    chunks = []\n    try:\n        while True:\n"
           "            chunks.append(bytearray(10_000_000))\n    except MemoryError:\n"
           "        raise AssertionError(f'stopped at {len(chunks) * 10} MB') from None\n")
    result = sandbox.grade_patch(with_test(task, "test_hog", hog), "")
    assert result.outcome == "unresolved", (result.reason, result.log_tail)
    stopped_mb = int(re.search(r"AssertionError: stopped at (\d+) MB", result.log_tail).group(1))
    assert stopped_mb <= 400


def test_decide_counts_skipped_and_missing_tests_as_not_passed(task: Task) -> None:
    everything = {F2P: "PASSED", MUL: "PASSED", ENV: "PASSED"}
    TestRun = pytest_runner.TestRun
    assert decide(task, TestRun(everything, exit_code=0)).outcome == "resolved"
    assert decide(task, TestRun({**everything, F2P: "XFAIL"}, exit_code=0)).outcome == "resolved"  # as swebench
    skipped = decide(task, TestRun({**everything, F2P: "SKIPPED"}, exit_code=0))
    assert skipped.outcome == "unresolved" and skipped.tests[F2P] == "SKIPPED"
    missing = decide(task, TestRun({F2P: "PASSED", MUL: "PASSED"}, exit_code=1))
    assert missing.outcome == "unresolved" and missing.tests[ENV] == "MISSING"

"""Verdicts that must not depend on the pytest version or on stray processes: failed unittest sub-tests fail their
test under pytest 8 and 9, and processes a test leaves behind neither outlive grading nor stall it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from repro.common.venvs import ensure_harness_env
from repro.execution.pytest_runner import parse_statuses
from repro.sandbox.repos import git
from repro.tasks.schema import Task
from tests.support import commit_all, make_sandbox

pytestmark = pytest.mark.timeout(300)

MOD = "def double(x):\n    return x * 3\n\n\ndef triple(x):\n    return x * 3\n"
SUBTESTS = """import unittest

from mod import double, triple


class TestMod(unittest.TestCase):
    def test_double(self):
        for x in (1, 2, 3):
            with self.subTest(x=x):
                self.assertEqual(double(x), 2 * x)

    def test_triple(self):
        for x in (1, 2, 3):
            with self.subTest(x=x):
                self.assertEqual(triple(x), 3 * x)
"""
F2P, P2P = "tests/test_mod.py::TestMod::test_double", "tests/test_mod.py::TestMod::test_triple"


def _repo_with(repos: Path, name: str, files: dict[str, str]) -> str:
    path = repos / f"acme__{name}"
    (path / "tests").mkdir(parents=True)
    git(["init", "-q", "-b", "main"], path)
    for rel, text in files.items():
        (path / rel).write_text(text)
    return commit_all(path, "base")


def _patch(repos: Path, name: str, base: str, rel: str, text: str) -> str:
    path = repos / f"acme__{name}"
    original = (path / rel).read_text()
    (path / rel).write_text(text)
    patch = git(["diff", base], path).stdout
    (path / rel).write_text(original)
    return patch


@pytest.fixture(scope="module")
def pytest8_python() -> str:
    """An interpreter whose pytest is 8.3.5 (pytest 9 is the project's own)."""
    return str(ensure_harness_env("grading-pytest", "8.3.5", ["pytest==8.3.5"]).python)


@pytest.fixture(scope="module")
def subtest_task(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Task]:
    repos = tmp_path_factory.mktemp("repos")
    base = _repo_with(repos, "mod", {"mod.py": MOD, "tests/test_mod.py": SUBTESTS})
    gold = _patch(repos, "mod", base, "mod.py", MOD.replace("return x * 3", "return x * 2", 1))
    task = Task(instance_id="acme__mod-1", repo="acme/mod", base_commit=base, problem_statement="double triples",
                patch=gold, FAIL_TO_PASS=[F2P], PASS_TO_PASS=[P2P])
    return repos, task


def test_parse_statuses_fails_a_test_with_a_failed_subtest() -> None:
    log = ("PASSED tests/t.py::T::test_a\nPASSED tests/t.py::T::test_b\n"
           "SUBFAILED(x=2) tests/t.py::T::test_b - AssertionError: 0 != 6\n"
           "SUBFAILED[msg with spaces and a::b] (x=1, y=2) tests/t.py::T::test_c - AssertionError\n")
    assert parse_statuses(log) == {"tests/t.py::T::test_a": "PASSED", "tests/t.py::T::test_b": "FAILED",
                                   "tests/t.py::T::test_c": "FAILED"}


@pytest.mark.parametrize("runner", ["pytest9", "pytest8"])
def test_a_broken_subtest_is_unresolved_under_both_pytest_majors(subtest_task, tmp_path, runner, request) -> None:
    repos, task = subtest_task
    python = request.getfixturevalue("pytest8_python") if runner == "pytest8" else None
    sandbox = make_sandbox(repos, tmp_path, **({"python": python} if python else {}))
    fixed = MOD.replace("return x * 3", "return x * 2", 1)
    broken = _patch(repos, "mod", task.base_commit, "mod.py",
                    fixed.replace("    return x * 3\n", "    return 0 if x == 2 else x * 3\n"))
    assert sandbox.grade_patch(task, task.patch).outcome == "resolved"
    result = sandbox.grade_patch(task, broken)  # the fix, plus a PASS_TO_PASS sub-test broken
    assert result.outcome == "unresolved" and result.tests[P2P] == "FAILED", (result.reason, result.log_tail)
    empty = sandbox.grade_patch(task, "")
    assert empty.outcome == "unresolved" and empty.tests[F2P] == "FAILED"


BACKGROUND = """import subprocess
import sys


def test_leaves_a_process_behind():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "{marker}"])


def test_fine():
    assert True
"""


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes()
                status = Path(entry.path, "status").read_text()
            except OSError:
                continue
            if marker.encode() in cmdline and "\nState:\tZ" not in status:
                found.append(int(entry.name))
    return found


def test_a_stray_process_neither_outlives_grading_nor_stalls_it(tmp_path: Path) -> None:
    repos, marker = tmp_path / "repos", f"stray-{os.getpid()}-{time.monotonic_ns()}"
    test_file = BACKGROUND.replace("{marker}", marker)  # the child inherits pytest's stdout: it holds the pipe
    base = _repo_with(repos, "bg", {"mod.py": "X = 1\n", "tests/test_bg.py": test_file})
    task = Task(instance_id="acme__bg-1", repo="acme/bg", base_commit=base, problem_statement="p",
                FAIL_TO_PASS=["tests/test_bg.py::test_fine"],
                PASS_TO_PASS=["tests/test_bg.py::test_leaves_a_process_behind"])
    sandbox = make_sandbox(repos, tmp_path / "ws", test_timeout_s=20)
    started = time.monotonic()
    result = sandbox.grade_patch(task, "")
    assert result.outcome == "resolved", (result.reason, result.log_tail)  # not a timeout
    assert time.monotonic() - started < 15
    assert _processes_with(marker) == []


def test_a_timeout_reports_the_configured_limit(tmp_path: Path) -> None:
    repos = tmp_path / "repos"
    hang = "import time\n\n\ndef test_hangs():\n    time.sleep(60)\n"
    base = _repo_with(repos, "hang", {"mod.py": "X = 1\n", "tests/test_hang.py": hang})
    task = Task(instance_id="acme__hang-1", repo="acme/hang", base_commit=base, problem_statement="p",
                FAIL_TO_PASS=["tests/test_hang.py::test_hangs"])
    result = make_sandbox(repos, tmp_path / "ws", test_timeout_s=1.5).grade_patch(task, "")
    assert result.outcome == "timeout" and "time limit of 1.5 s" in result.reason


CHEAT = """import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""


def test_a_conftest_the_patch_adds_cannot_rewrite_reports(subtest_task, tmp_path) -> None:
    repos, task = subtest_task
    sandbox = make_sandbox(repos, tmp_path)
    ws = sandbox.workspace(task, "cheat")
    (ws.path / "conftest.py").write_text(CHEAT)
    (ws.path / "tests/conftest.py").write_text(CHEAT)
    result = sandbox.grade_patch(task, ws.diff())
    assert result.outcome == "unresolved" and result.tests[F2P] == "FAILED", (result.reason, result.log_tail)
    assert "conftest.py, tests/conftest.py" in result.reason


def test_the_grading_interpreter_and_pytest_version_are_in_the_fingerprint(pytest8_python) -> None:
    from repro.rl.evaluator import EvalConfig, build_spec
    from repro.sandbox.grading_env import GRADING_PYTEST, default_grading_python, grading_identity
    from repro.sandbox.local import LocalSandboxConfig
    from repro.testing import FakeHarness

    assert grading_identity(default_grading_python())["pytest"] == GRADING_PYTEST  # the pinned default
    assert grading_identity(pytest8_python)["pytest"] == "8.3.5"
    task = Task(instance_id="i", repo="acme/x", base_commit="abc", problem_statement="p")

    def spec(python: str | None):
        return build_spec(FakeHarness(), "set", [task], LocalSandboxConfig(python=python), EvalConfig(), None)

    default, pinned8 = spec(None), spec(pytest8_python)
    assert default.sandbox.settings["grading"]["pytest"] == GRADING_PYTEST
    assert "/" not in json.dumps(default.sandbox.settings)  # versions only: no machine's paths
    assert default.fingerprint() != pinned8.fingerprint()
    assert spec(None).fingerprint() == default.fingerprint()

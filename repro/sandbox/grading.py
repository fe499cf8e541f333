"""Grading a patch locally, the SWE-bench way.

In a fresh working copy at ``base_commit`` (never the agent's own copy): apply ``test_patch``, then the agent's
patch without its changes to *protected* files (those ``test_patch`` touches, as SWE-bench resets them, and the
files holding the graded tests), run FAIL_TO_PASS + PASS_TO_PASS with pytest, and decide with swebench's
``get_eval_tests_report`` / ``get_resolution_status``.

Outcome rule:

* ``error`` — the grader could not build a trustworthy test run, whatever the patch: repository or base
  commit missing, the grading copy could not be made, ``test_patch`` does not apply at ``base_commit``, the task
  names no FAIL_TO_PASS test, the interpreter cannot be started or has no pytest.
* ``timeout`` — the test run passed ``test_timeout_s`` (wall clock) or the CPU-time rlimit.
* ``unresolved`` — everything else that goes wrong once the agent's patch is in: it does not apply, it is empty,
  collection fails (a syntax or import error), the interpreter crashes or is killed by another rlimit, a test
  fails, errors, is skipped or is absent from the log. Base + ``test_patch`` is known to work (tasks are
  validated with their gold patch), so a broken run after the patch is the patch's doing.
* ``resolved`` — every FAIL_TO_PASS and every PASS_TO_PASS test passed (swebench's FULL). Stricter than
  swebench in one place: a SKIPPED test counts as not passed (swebench leaves it out of both lists, so a patch
  that made every FAIL_TO_PASS test skip would count as resolved).

Files a patch may not add, because they run before or around the tests rather than being tested: a new
``conftest.py`` (pytest hooks can rewrite reports: a patch adding one was graded resolved with no fix), and
Python start-up hooks (``sitecustomize.py``, ``usercustomize.py``, ``*.pth``). They are left out when the patch is
applied, and the verdict's reason says so. Third-party pytest plugins do not load (``PYTEST_DISABLE_PLUGIN_AUTOLOAD``)
and the test runner itself cannot be replaced (see ``pytest_runner.PYTEST_MAIN``). Known gaps: a patch may still
edit a ``conftest.py`` the repository already has, and XFAIL counts as passed, so code that calls
``pytest.xfail()`` would pass.
"""

from __future__ import annotations

import re
import signal
import tempfile
import time
from pathlib import Path

from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS, ResolvedStatus
from swebench.harness.grading import get_eval_tests_report, get_resolution_status, test_passed

from repro.execution.pytest_runner import TestRun, run_pytest
from repro.protocols import GradeResult
from repro.sandbox.config import LocalSandboxConfig
from repro.sandbox.grading_env import grading_python
from repro.sandbox.repos import GitError, RepoError, RepoResolver, apply_patch, make_working_copy, remove_tree
from repro.tasks.schema import Task

# Paths a patch touches: `--- a/p` / `+++ b/p` lines (tab-separated timestamps cut), `diff --git a/p b/p` headers.
_PATCH_PATHS = re.compile(r"^(?:--- a/|\+\+\+ b/)([^\t\n]+)|^diff --git a/(\S+) b/(\S+)$", re.M)
LOG_TAIL_CHARS = 4000
PYTEST_EXIT = {2: "interrupted", 3: "internal error", 4: "usage error (a test id not found?)", 5: "no tests collected"}


_ADDED_PATHS = re.compile(r"^--- /dev/null\n\+\+\+ b/([^\t\n]+)", re.M)
_HOOK_NAMES = ("conftest.py", "sitecustomize.py", "usercustomize.py")


def added_hook_files(patch: str) -> tuple[str, ...]:
    """Files ``patch`` adds that would run around the tests (``conftest.py``, start-up hooks, ``*.pth``)."""
    added = _ADDED_PATHS.findall(patch)
    return tuple(p for p in added if p.rsplit("/", 1)[-1] in _HOOK_NAMES or p.endswith(".pth"))


def protected_paths(task: Task) -> tuple[str, ...]:
    """Files whose changes in the agent's patch are ignored: test_patch's files and the graded tests' files."""
    paths = {p for match in _PATCH_PATHS.findall(task.test_patch) for p in match if p}
    paths.update(t.split("::", 1)[0] for t in (*task.FAIL_TO_PASS, *task.PASS_TO_PASS) if "::" in t)
    return tuple(sorted(paths))


def graded_tests(task: Task) -> list[str]:
    """FAIL_TO_PASS then PASS_TO_PASS, without repeats."""
    return list(dict.fromkeys([*task.FAIL_TO_PASS, *task.PASS_TO_PASS]))


def decide(task: Task, run: TestRun, limits_cpu_s: int = 0) -> GradeResult:
    """The outcome of a finished test run (see the module docstring for the rule)."""
    tail = run.log[-LOG_TAIL_CHARS:]
    if run.timed_out:
        return GradeResult("timeout", f"tests killed at the time limit of {run.timeout_s:g} s (sandbox.test_timeout_s)",
                           log_tail=tail)
    if run.exit_code == -signal.SIGXCPU:
        return GradeResult("timeout", f"tests ran past the CPU-time limit ({limits_cpu_s} s)", log_tail=tail)
    if run.exit_code == 1 and not run.statuses and "No module named 'pytest'" in run.log:
        return GradeResult("error", "pytest is not installed for the grading interpreter", log_tail=tail)
    tests = {t: run.statuses.get(t, "MISSING") for t in graded_tests(task)}
    report = get_eval_tests_report(run.statuses, {FAIL_TO_PASS: task.FAIL_TO_PASS, PASS_TO_PASS: task.PASS_TO_PASS})
    all_passed = all(test_passed(t, run.statuses) for t in tests)
    if all_passed and get_resolution_status(report) == ResolvedStatus.FULL.value:
        return GradeResult("resolved", f"all {len(tests)} tests pass", tests, log_tail=tail)
    return GradeResult("unresolved", _failure_reason(task, run), tests, log_tail=tail)


def _failure_reason(task: Task, run: TestRun) -> str:
    parts = []
    if "ERROR collecting" in run.log:
        parts.append("pytest could not collect the tests (an import or syntax error?)")
    elif run.exit_code < 0:
        parts.append(f"pytest killed by {signal.Signals(-run.exit_code).name}")
    elif run.exit_code in PYTEST_EXIT:
        parts.append(f"pytest exit {run.exit_code}: {PYTEST_EXIT[run.exit_code]}")
    for kind, ids in ((FAIL_TO_PASS, task.FAIL_TO_PASS), (PASS_TO_PASS, task.PASS_TO_PASS)):
        bad = [t for t in ids if not test_passed(t, run.statuses)]
        if bad:
            more = f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""
            parts.append(f"{kind} not passing ({len(bad)}/{len(ids)}): {', '.join(bad[:3])}{more}")
    return "; ".join(parts)


def _grade_in_copy(task: Task, patch: str, copy: Path, config: LocalSandboxConfig, resolver: RepoResolver
                   ) -> GradeResult:
    try:
        repo, sha = resolver.resolve(task)
    except RepoError as exc:
        return GradeResult("error", str(exc))
    if not task.FAIL_TO_PASS:
        return GradeResult("error", f"task {task.instance_id} names no FAIL_TO_PASS test")
    try:
        make_working_copy(repo, sha, copy)
    except (GitError, OSError) as exc:
        return GradeResult("error", f"could not make a grading copy: {exc}")
    if task.test_patch.strip() and (problem := apply_patch(copy, task.test_patch)):
        return GradeResult("error", "test_patch does not apply at base_commit", log_tail=problem[-LOG_TAIL_CHARS:])
    empty = not patch.strip()
    hooks = added_hook_files(patch)
    if not empty and (problem := apply_patch(copy, patch, exclude=(*protected_paths(task), *hooks))):
        return GradeResult("unresolved", "patch does not apply", log_tail=problem[-LOG_TAIL_CHARS:])
    try:
        python = grading_python(config.python)
        run = run_pytest(copy, graded_tests(task), config.test_timeout_s, config.limits, python,
                         config.fork_pytest)
    except OSError as exc:
        return GradeResult("error", f"could not start the grading interpreter {config.python}: {exc}")
    result = decide(task, run, config.limits.cpu_s)
    if empty and result.outcome == "unresolved":
        result.reason = f"empty patch; {result.reason}"
    if hooks:
        result.reason = f"{result.reason}; left out of the patch (files that run around the tests): {', '.join(hooks)}"
    return result


def grade_patch(task: Task, patch: str, config: LocalSandboxConfig, resolver: RepoResolver | None = None,
                root: Path | None = None) -> GradeResult:
    """Grade ``patch`` (a ``git apply`` patch against ``base_commit``; "" = no change) for ``task``.

    The grading copy is made under ``root`` (default: the system temp dir) and removed afterwards unless
    ``config.keep_workspaces``.
    """
    started = time.monotonic()
    resolver = resolver or RepoResolver(Path(config.repos_dir).expanduser())
    safe_id = "".join(c if c.isalnum() or c in "._-" else "_" for c in task.instance_id)
    copy = Path(tempfile.mkdtemp(prefix=f"grade-{safe_id}-", dir=root))
    try:
        result = _grade_in_copy(task, patch, copy, config, resolver)
    finally:
        if not config.keep_workspaces:
            remove_tree(copy)
    result.duration_s = time.monotonic() - started
    return result

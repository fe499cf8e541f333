"""What grading runs inside a task's container: swebench's own eval script and log parser for SWE-bench rows, and
an eval script of the same shape for the bundled tasks.

SWE-bench rows (a ``repo``/``version`` that swebench knows): ``swebench.harness.test_spec.make_test_spec`` gives
the eval script (conda env, reset of the test files, ``test_patch`` in a heredoc, the repository's test command
between the ``>>>>> Start/End Test Output`` markers) and ``MAP_REPO_TO_PARSER`` the repository's log parser.

Bundled tasks: the same steps with the pinned grading pytest (``-rA``, plugins off, the runner not replaceable by
the patch) on the graded test ids, parsed with swebench's pytest parser (:func:`pytest_runner.parse_statuses`).
The line after the test command prints the test command's exit code (``REPRO_TEST_EXIT=<n>``), outside the
markers.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

from repro.sandbox.grading import graded_tests
from repro.sandbox.pytest_runner import PYTEST_MAIN, parse_statuses
from repro.tasks.schema import Task

HEREDOC = "EOF_114329324912"  # swebench's heredoc delimiter
TESTBED = "/testbed"
TEST_EXIT = re.compile(r"^REPRO_TEST_EXIT=(\d+)$", re.M)
GRADING_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1",
               "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "HOME": "/root"}
PYTEST_ARGS = ("-rA", "-p", "no:cacheprovider", "-o", "addopts=", "--no-header", "-q", "--tb=short")


@dataclass(frozen=True)
class EvalSpec:
    """An eval script and the parser for its log (statuses by test id)."""

    script: str
    parse: Callable[[str], dict[str, str]]
    source: str  # "swebench" or "bundled"


def _files_in_patch(patch: str) -> list[str]:
    return list(dict.fromkeys(re.findall(r"^diff --git a/\S+ b/(\S+)$", patch, re.M)))


def bundled_eval_script(task: Task, base_commit: str) -> str:
    """The bundled task's eval script, shaped as swebench's ``make_eval_script_list_py``."""
    test_files = _files_in_patch(task.test_patch)
    reset = f"git checkout {base_commit} {' '.join(map(shlex.quote, test_files))}" if test_files else ":"
    pytest = shlex.join(["python3", "-c", PYTEST_MAIN, *PYTEST_ARGS, *graded_tests(task)])
    lines = ["#!/bin/bash", "set -uxo pipefail", f"cd {TESTBED}",
             f"git config --global --add safe.directory {TESTBED}", "git status",
             f"git -c core.fileMode=false diff {base_commit}", reset]
    if task.test_patch.strip():
        lines.append(f"git apply -v - <<'{HEREDOC}'\n{task.test_patch.rstrip(chr(10))}\n{HEREDOC}")
    lines += [f": '{START_TEST_OUTPUT}'", pytest, "echo REPRO_TEST_EXIT=$?", f": '{END_TEST_OUTPUT}'", reset]
    return "\n".join(lines) + "\n"


def test_section(log: str) -> str:
    """The log between swebench's markers (the whole log when they are missing)."""
    if START_TEST_OUTPUT in log and END_TEST_OUTPUT in log:
        return log.split(START_TEST_OUTPUT, 1)[1].split(END_TEST_OUTPUT, 1)[0]
    return log


def test_exit_code(log: str) -> int | None:
    """The test command's exit code a bundled eval script printed, if it got that far."""
    found = TEST_EXIT.findall(log)
    return int(found[-1]) if found else None


def swebench_knows(task: Task) -> bool:
    """Whether swebench has a test spec for the task's repository and version."""
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS

    return task.version in MAP_REPO_VERSION_TO_SPECS.get(task.repo, {})


def swebench_test_spec(task: Task) -> Any:
    """swebench's ``TestSpec`` for a SWE-bench row, as ``make_test_spec`` builds it but without the image-building
    scripts (``make_env_script_list`` fetches the repository's requirements over the network; an evaluation
    uses images that are already built)."""
    from swebench.harness.test_spec.test_spec import (
        MAP_REPO_TO_EXT,
        MAP_REPO_VERSION_TO_SPECS,
        TestSpec,
        make_eval_script_list,
    )

    row = task.to_row()
    specs = MAP_REPO_VERSION_TO_SPECS[task.repo][task.version]
    eval_list = make_eval_script_list(row, specs, "testbed", TESTBED, task.base_commit, task.test_patch)
    return TestSpec(instance_id=task.instance_id, repo=task.repo, env_script_list=[], repo_script_list=[],
                    eval_script_list=eval_list, version=task.version, arch="x86_64", FAIL_TO_PASS=task.FAIL_TO_PASS,
                    PASS_TO_PASS=task.PASS_TO_PASS, language=MAP_REPO_TO_EXT[task.repo],
                    docker_specs=specs.get("docker_specs", {}), namespace=None, base_image_tag="latest",
                    env_image_tag="latest", instance_image_tag="latest")


def swebench_eval_spec(task: Task) -> EvalSpec:
    """swebench's eval script and the repository's log parser for a SWE-bench row."""
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER

    spec = swebench_test_spec(task)
    parser = MAP_REPO_TO_PARSER[task.repo]
    return EvalSpec(spec.eval_script, lambda log: parser(test_section(log), spec), "swebench")


def eval_spec(task: Task, base_commit: str) -> EvalSpec:
    """The eval spec of any task (swebench's for rows it knows, the bundled shape otherwise)."""
    if swebench_knows(task):
        return swebench_eval_spec(task)
    return EvalSpec(bundled_eval_script(task, base_commit), lambda log: parse_statuses(test_section(log)),
                    "bundled")

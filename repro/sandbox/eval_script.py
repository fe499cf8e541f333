"""What grading runs inside a task's container: swebench's own eval script and log parser for SWE-bench rows, and
an eval script of the same shape for the bundled tasks.

SWE-bench rows (a ``repo``/``version`` that swebench knows): ``swebench.harness.test_spec.make_test_spec`` gives
the eval script (conda env, reset of the test files, ``test_patch`` in a heredoc, the repository's test command
between the ``>>>>> Start/End Test Output`` markers) and ``MAP_REPO_TO_PARSER`` the repository's log parser.

SWE-smith rows: the bundled shape in SWE-smith's image layout (conda env ``testbed``, the instance branch's "Bug
Patch" commit checked out before the patch by ``prepare``, the graded tests' files reset to it), graded on every
FAIL_TO_PASS and PASS_TO_PASS test id with swebench's pytest parser. One deliberate difference from SWE-smith's own
harness: it runs a subset of the tests and counts a test absent from the log as passed; here every graded id is
run by name, so an absent test did not run (a collection error) and counts as not passed.

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

from repro.execution.pytest_runner import PYTEST_MAIN, parse_statuses
from repro.sandbox.grading import graded_tests
from repro.tasks.schema import Task
from repro.tasks.swesmith import grading_checkout, is_swesmith

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
    source: str  # "swebench", "swe-smith" or "bundled"
    prepare: str = ""  # run in the grading container before the patch is applied ("" = nothing)


def _files_in_patch(patch: str) -> list[str]:
    return list(dict.fromkeys(re.findall(r"^diff --git a/\S+ b/(\S+)$", patch, re.M)))


CONDA_ACTIVATE = ("source /opt/miniconda3/bin/activate", "conda activate testbed")  # SWE-smith / swebench images


def bundled_eval_script(task: Task, base_commit: str, test_files: list[str] | None = None,
                        activate: tuple[str, ...] = ()) -> str:
    """The bundled task's eval script, shaped as swebench's ``make_eval_script_list_py``: ``test_files`` (default:
    those ``test_patch`` touches) are reset to ``base_commit`` around the test run; ``activate`` lines come first."""
    test_files = _files_in_patch(task.test_patch) if test_files is None else test_files
    reset = f"git checkout {base_commit} {' '.join(map(shlex.quote, test_files))}" if test_files else ":"
    pytest = shlex.join(["python3", "-c", PYTEST_MAIN, *PYTEST_ARGS, *graded_tests(task)])
    lines = ["#!/bin/bash", "set -uxo pipefail", *activate, f"cd {TESTBED}",
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


def swesmith_eval_spec(task: Task) -> EvalSpec:
    """A SWE-smith row's eval spec: ``prepare`` checks out the "Bug Patch" commit, the script resets the graded
    tests' files to it and runs every graded test id."""
    test_files = sorted({t.split("::", 1)[0] for t in graded_tests(task) if "::" in t})
    script = bundled_eval_script(task, "HEAD", test_files, CONDA_ACTIVATE)
    return EvalSpec(script, lambda log: parse_statuses(test_section(log)), "swe-smith", grading_checkout(task))


def eval_spec(task: Task, base_commit: str) -> EvalSpec:
    """The eval spec of any task (swebench's for rows it knows, SWE-smith's layout for its rows, the bundled shape
    otherwise)."""
    if is_swesmith(task):
        return swesmith_eval_spec(task)
    if swebench_knows(task):
        return swebench_eval_spec(task)
    return EvalSpec(bundled_eval_script(task, base_commit), lambda log: parse_statuses(test_section(log)),
                    "bundled")

"""SWE-smith rows: their schema, and how they map onto the SWE-bench-shaped :class:`Task`.

A SWE-smith row (``SWE-bench/SWE-smith`` and its per-language siblings) has ``instance_id``, ``repo``
(``swesmith/<owner>__<name>.<commit8>``), ``image_name``, ``patch``, ``FAIL_TO_PASS`` / ``PASS_TO_PASS`` (lists)
and ``problem_statement``; no ``base_commit`` and no ``test_patch``. Two meanings differ from SWE-bench:

* ``patch`` introduces the bug; the fix is its reverse (SWE-smith's gold evaluation applies it with ``--reverse``).
  :func:`swesmith_row` keeps it as ``extra["bug_patch"]`` and stores the reverse as ``Task.patch``.
* The repository state is a git branch named ``instance_id`` in the image's ``/testbed``: its head commit
  ("Remove F2P Tests") has the bug and lacks the FAIL_TO_PASS test files, its parent ("Bug Patch") has both.
  The agent works at the head (``startup_command``); grading checks out the parent before applying the patch
  (``grading_checkout``). ``Task.base_commit`` is the branch name, so every ``git diff <base_commit>`` is taken
  against the state the agent was given.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from repro.tasks.schema import Task

SCHEMA = "swe-smith"
SCHEMA_KEY = "dataset_schema"
TESTS_REMOVED_SUBJECT = "Remove F2P Tests"
_HUNK = re.compile(r"^@@ -(\d+(?:,\d+)?) \+(\d+(?:,\d+)?) @@(.*)$")


def is_swesmith_row(row: dict[str, Any]) -> bool:
    """A row in SWE-smith's schema: an ``image_name`` and no ``base_commit``."""
    return bool(row.get("image_name")) and not row.get("base_commit")


def is_swesmith(task: Task) -> bool:
    return task.extra.get(SCHEMA_KEY) == SCHEMA


def swesmith_row(row: dict[str, Any]) -> dict[str, Any]:
    """The row in SWE-bench's field meanings: ``base_commit`` = the instance branch, ``patch`` = the fix (the
    reverse of the bug patch, which is kept as ``bug_patch``), marked with ``dataset_schema: swe-smith``."""
    bug_patch = str(row.get("patch") or "")
    return {**row, "base_commit": row["instance_id"], "patch": reverse_patch(bug_patch), "bug_patch": bug_patch,
            SCHEMA_KEY: SCHEMA}


def startup_command(task: Task) -> str:
    """What the harness runs in the container before the agent starts (mini's ``run.env_startup_command``)."""
    return f"git checkout -q -f {shlex.quote(task.instance_id)}" if is_swesmith(task) else ""


def grading_checkout(task: Task) -> str:
    """Before the patch is applied in a grading container: the instance branch, then its "Bug Patch" parent when
    the head removed the FAIL_TO_PASS test files (the bug stays, the tests come back)."""
    branch = shlex.quote(task.instance_id)
    return (f"git checkout -q -f {branch} && if [ \"$(git log -1 --format=%s)\" = \"{TESTS_REMOVED_SUBJECT}\" ]; "
            "then git checkout -q HEAD~1; fi")


def reverse_patch(patch: str) -> str:
    """``patch`` reversed, as ``git apply --reverse`` reads it: old and new sides swapped in headers, hunks and
    file modes. Hunk bodies are read by their line counts, so a removed line that starts with ``--`` stays a
    body line. Lines outside any diff are kept as they are."""
    out: list[str] = []
    lines = patch.splitlines(keepends=True)
    index, old_left, new_left = 0, 0, 0
    while index < len(lines):
        line = lines[index]
        if old_left > 0 or new_left > 0:  # a hunk body line
            kind = line[:1]
            old_left -= kind in (" ", "-", "\n", "")
            new_left -= kind in (" ", "+", "\n", "")
            out.append(("+" + line[1:]) if kind == "-" else ("-" + line[1:]) if kind == "+" else line)
            index += 1
            continue
        if line.startswith("\\"):  # "\ No newline at end of file" after a hunk's last line
            out.append(line)
        elif line.startswith("--- ") and index + 1 < len(lines) and lines[index + 1].startswith("+++ "):
            out += [_swap_side(lines[index + 1], "+++ ", "--- "), _swap_side(line, "--- ", "+++ ")]
            index += 1
        elif hunk := _HUNK.match(line.rstrip("\n")):
            old_left, new_left = _count(hunk.group(1)), _count(hunk.group(2))
            out.append(f"@@ -{hunk.group(2)} +{hunk.group(1)} @@{hunk.group(3)}" + _eol(line))
        else:
            out.append(_reverse_header(line))
        index += 1
    return "".join(out)


def _count(span: str) -> int:
    return int(span.split(",", 1)[1]) if "," in span else 1


def _eol(line: str) -> str:
    return line[len(line.rstrip("\n")):]


def _swap_side(line: str, old: str, new: str) -> str:
    path = line[len(old):]
    if path.startswith("a/"):
        path = "b/" + path[2:]
    elif path.startswith("b/"):
        path = "a/" + path[2:]
    return new + path


_SWAPS = (("new file mode ", "deleted file mode "), ("rename from ", "rename to "), ("copy from ", "copy to "),
          ("old mode ", "new mode "))


def _reverse_header(line: str) -> str:
    text = line.rstrip("\n")
    if text.startswith("diff --git a/") and " b/" in text:
        old, new = text[len("diff --git a/"):].split(" b/", 1)
        return f"diff --git a/{new} b/{old}" + _eol(line)
    if found := re.match(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)(.*)$", text):
        return f"index {found.group(2)}..{found.group(1)}{found.group(3)}" + _eol(line)
    for first, second in _SWAPS:
        if line.startswith(first):
            return second + line[len(first):]
        if line.startswith(second):
            return first + line[len(second):]
    return line

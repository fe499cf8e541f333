"""The task schema: SWE-bench instance fields, so SWE-bench Verified, SWE-smith and Agent Lightning's rows
load as they are, plus a few optional fields for bundled distributions."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

SWEBENCH_FIELDS = (
    "instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch", "FAIL_TO_PASS",
    "PASS_TO_PASS", "version", "environment_setup_commit", "hints_text", "created_at",
)


@dataclass
class Task:
    """One task = one SWE-bench-style instance.

    ``repo`` is ``owner/name``; the local sandbox resolves it to a git repository on disk
    (``<repos_dir>/owner__name``) unless ``repo_path`` names one directly. ``FAIL_TO_PASS`` and
    ``PASS_TO_PASS`` are pytest node ids (SWE-bench stores them as JSON-encoded strings; loaders decode).
    """

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str = ""  # the gold fix (never shown to the agent)
    test_patch: str = ""  # applied before grading
    FAIL_TO_PASS: list[str] = field(default_factory=list)
    PASS_TO_PASS: list[str] = field(default_factory=list)
    version: str = ""
    environment_setup_commit: str = ""
    hints_text: str = ""
    created_at: str = ""
    repo_path: str | None = None  # a local git repository (overrides repos_dir resolution)
    family: str = ""  # bundled distributions: "package:<name>" or "procedural"
    operator: str = ""  # mutation operator that made the bug
    difficulty: str = ""  # "one_step" / "one_step_brief" (statement pins the fault) or "multi_step" (inspect first)
    extra: dict[str, Any] = field(default_factory=dict)  # unknown columns of the source row, kept

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Task:
        """Build from a SWE-bench-style row; test lists may be JSON strings; unknown keys go to ``extra``."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in row.items() if k in known and k != "extra"}
        extra = {k: v for k, v in row.items() if k not in known}
        for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            if isinstance(values.get(key), str):
                values[key] = json.loads(values[key]) if values[key] else []
        missing = [k for k in ("instance_id", "repo", "base_commit", "problem_statement") if not values.get(k)]
        if missing:
            raise ValueError(f"task row {row.get('instance_id', '?')!r} lacks required fields {missing}")
        return cls(**values, extra={**row.get("extra", {}), **extra})

    def to_row(self) -> dict[str, Any]:
        """A JSON-ready row (test lists as lists)."""
        return asdict(self)

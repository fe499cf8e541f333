"""Task repositories on disk: one bare git repository per bundled package / procedural batch.

``<cache>/repos/repro-bundled__<name>`` holds the clean code (``refs/heads/main``, or one ``refs/clean/*``
commit per procedural module) and one root commit per task (the whole buggy tree, with no parent that would
show the fix) kept
reachable by ``refs/tasks/<instance_id>``. Commits are written with ``git fast-import`` under a fixed author,
committer and date, so their shas are the same on every machine. Building is idempotent (a marker per hash of
the import stream) and additive (a new distribution adds refs, never removes any), and a file lock makes
concurrent builders safe.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from repro.common.files import cache_dir, locked

REPO_OWNER = "repro-bundled"
IDENTITY = "repro tasks <tasks@repro.invalid> 946684800 +0000"  # fixed: 2000-01-01T00:00:00Z
MARKERS = "repro-inputs"


def repos_dir() -> Path:
    """Where task repositories live, named ``owner__name`` (the local sandbox's convention)."""
    return cache_dir() / "repos"


def repo_dir(name: str) -> Path:
    return repos_dir() / f"{REPO_OWNER}__{name}"


@dataclass(frozen=True)
class CommitSpec:
    """One commit: ``files`` (path -> text) on top of ``parent``'s tree (an earlier spec's ref), or a root."""

    ref: str
    files: dict[str, str] = field(default_factory=dict)
    parent: str | None = None
    message: str = "state"


def _data(text: str) -> bytes:
    raw = text.encode()
    return b"data %d\n%s\n" % (len(raw), raw)


def import_stream(commits: Sequence[CommitSpec]) -> tuple[bytes, dict[str, int]]:
    """The ``git fast-import`` input for ``commits`` and the mark number of each ref."""
    marks: dict[str, int] = {}
    parts: list[bytes] = []
    for number, spec in enumerate(commits, start=1):
        if spec.parent is not None and spec.parent not in marks:
            raise ValueError(f"commit {spec.ref!r}: parent {spec.parent!r} must come earlier")
        marks[spec.ref] = number
        parts.append(b"reset %s\ncommit %s\nmark :%d\n" % (spec.ref.encode(), spec.ref.encode(), number))
        parts.append(b"author %s\ncommitter %s\n" % (IDENTITY.encode(), IDENTITY.encode()))
        parts.append(_data(spec.message))
        if spec.parent is not None:
            parts.append(b"from :%d\n" % marks[spec.parent])
        for path in sorted(spec.files):
            parts.append(b"M 100644 inline %s\n" % path.encode())
            parts.append(_data(spec.files[path]))
        parts.append(b"\n")
    return b"".join(parts), marks


def _git(args: list[str], cwd: Path | None = None, stdin: bytes | None = None) -> bytes:
    proc = subprocess.run(["git", *args], cwd=cwd, input=stdin, capture_output=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:2])} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def _init_bare(path: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=path.name + ".init-", dir=path.parent))
    _git(["init", "--quiet", "--bare", str(tmp)])
    _git(["symbolic-ref", "HEAD", "refs/heads/main"], cwd=tmp)
    os.rename(tmp, path)


def materialize(name: str, commits: Sequence[CommitSpec]) -> tuple[Path, dict[str, str]]:
    """Make sure ``repro-bundled__<name>`` holds ``commits``; return its path and the sha of every ref."""
    stream, marks = import_stream(commits)
    digest = hashlib.sha256(stream).hexdigest()
    path = repo_dir(name)
    marker = path / MARKERS / f"{digest}.json"
    if marker.exists():
        return path, json.loads(marker.read_text())
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path.parent / f"{path.name}.lock"):
        if marker.exists():
            return path, json.loads(marker.read_text())
        if not (path / "HEAD").exists():
            _init_bare(path)
        with tempfile.NamedTemporaryFile(prefix="marks-", dir=path) as marks_file:
            _git(["fast-import", "--quiet", "--force", f"--export-marks={marks_file.name}"], cwd=path, stdin=stream)
            by_mark = dict(line.split() for line in Path(marks_file.name).read_text().splitlines())
        shas = {ref: by_mark[f":{number}"] for ref, number in marks.items()}
        _git(["pack-refs", "--all"], cwd=path)
        marker.parent.mkdir(exist_ok=True)
        tmp = marker.with_suffix(".tmp")
        tmp.write_text(json.dumps(shas, sort_keys=True))
        os.replace(tmp, marker)
    return path, shas

"""The hand-written packages shipped as data under ``repro_taskdata/packages/`` and pytest validation of their
mutants.

Each package directory is a repository root: ``<name>/`` (the code), ``tests/`` (its pytest tests) and an empty
``conftest.py`` (so pytest puts the root on ``sys.path``). They are data, not ``repro`` runtime code.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from repro.common.files import cache_dir, locked
from repro.execution.limits import ResourceLimits
from repro.execution.pytest_runner import run_pytest
from repro.tasks.mutate import Mutation
from repro_taskdata import PACKAGES_DIR

VALIDATION_TIMEOUT_S = 20.0
VALIDATION_LIMITS = ResourceLimits(cpu_s=3)  # a mutant that loops forever is killed after 3 CPU seconds
CLEAN_KEY = "clean"  # cache entry: the clean package's test ids


@dataclass(frozen=True)
class BundledPackage:
    """One shipped package: its files (relative path -> text), the modules to mutate and the test files."""

    name: str
    root: Path

    def files(self) -> dict[str, str]:
        found = sorted(p for p in self.root.rglob("*.py") if "__pycache__" not in p.parts)
        return {p.relative_to(self.root).as_posix(): p.read_text() for p in found}

    def modules(self) -> list[str]:
        """Files whose functions are mutated (the package's modules, not ``__init__.py``)."""
        return [p for p in self.files() if p.startswith(f"{self.name}/") and not p.endswith("__init__.py")]

    def test_files(self) -> list[str]:
        return [p for p in self.files() if p.startswith("tests/")]

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.files(), sort_keys=True).encode()).hexdigest()


def bundled_packages() -> dict[str, BundledPackage]:
    """Every package under ``repro_taskdata/packages`` by name."""
    return {p.name: BundledPackage(p.name, p) for p in sorted(PACKAGES_DIR.iterdir()) if (p / p.name).is_dir()}


def get_package(name: str) -> BundledPackage:
    packages = bundled_packages()
    if name not in packages:
        raise ValueError(f"unknown bundled package {name!r}; choose from {sorted(packages)}")
    return packages[name]


def write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@dataclass(frozen=True)
class Verdict:
    """What a mutant does to the package's tests: ``failing`` become FAIL_TO_PASS, ``passing`` PASS_TO_PASS."""

    failing: tuple[str, ...]
    passing: tuple[str, ...]

    @property
    def keeps(self) -> bool:
        """Kept as a task: breaks at least one test, every other test still passes."""
        return bool(self.failing)


class PytestValidator:
    """Runs a package's tests against its mutants with the sandbox's pytest runner, in private copies of the
    package (one per worker thread). Verdicts are cached on disk by package digest and Python version."""

    def __init__(self, package: BundledPackage, workers: int = 0) -> None:
        self.package = package
        self.files = package.files()
        self.workers = workers or max(1, os.cpu_count() or 1)
        tag = f"{package.digest()[:16]}-py{sys.version_info[0]}{sys.version_info[1]}"
        self.cache_path = cache_dir() / "tasks" / "validation" / f"{package.name}-{tag}.json"
        self.cache: dict[str, list[list[str]] | None] = self._load()

    def _load(self) -> dict[str, list[list[str]] | None]:
        try:
            return json.loads(self.cache_path.read_text())
        except (OSError, ValueError):
            return {}

    def save(self) -> None:
        """Merge this validator's verdicts into the on-disk cache (under a lock)."""
        self.cache_path.parent.mkdir(parents=True, exist_ok=True)
        with locked(self.cache_path.with_suffix(".lock")):
            merged = {**self._load(), **self.cache}
            tmp = self.cache_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(merged, sort_keys=True))
            os.replace(tmp, self.cache_path)

    @contextmanager
    def _copies(self, n: int) -> Iterator[queue.Queue[Path]]:
        with tempfile.TemporaryDirectory(prefix=f"repro-validate-{self.package.name}-") as tmp:
            pool: queue.Queue[Path] = queue.Queue()
            for i in range(n):
                write_tree(Path(tmp) / str(i), self.files)
                pool.put(Path(tmp) / str(i))
            yield pool

    def _run(self, root: Path) -> dict[str, str]:
        return run_pytest(root, ["tests"], VALIDATION_TIMEOUT_S, VALIDATION_LIMITS).statuses

    def clean_tests(self) -> list[str]:
        """The package's test ids; raises if the clean package does not pass its own tests."""
        if CLEAN_KEY not in self.cache:
            with self._copies(1) as pool:
                statuses = self._run(pool.get())
            broken = sorted(t for t, s in statuses.items() if s != "PASSED")
            if not statuses or broken:
                raise RuntimeError(f"bundled package {self.package.name!r} fails its own tests: {broken or 'none ran'}")
            self.cache[CLEAN_KEY] = [sorted(statuses)]
        return self.cache[CLEAN_KEY][0]

    def _verdict(self, pool: queue.Queue[Path], mutation: Mutation, mutant: str) -> list[list[str]] | None:
        root = pool.get()
        try:
            (root / mutation.path).write_text(mutant)
            statuses = self._run(root)
        finally:
            (root / mutation.path).write_text(self.files[mutation.path])
            shutil.rmtree(root / mutation.path.rsplit("/", 1)[0] / "__pycache__", ignore_errors=True)
            pool.put(root)
        tests = self.clean_tests()
        if set(statuses) != set(tests):
            return None  # collection error or timeout: the tests did not run one by one
        return [[t for t in tests if statuses[t] != "PASSED"], [t for t in tests if statuses[t] == "PASSED"]]

    def verdicts(self, items: list[tuple[Mutation, str]]) -> list[Verdict | None]:
        """One verdict per (mutation, mutant source); None when the tests could not run cleanly."""
        self.clean_tests()
        todo = [(m, s) for m, s in items if m.key not in self.cache]
        if todo:
            with self._copies(min(self.workers, len(todo))) as pool, ThreadPoolExecutor(self.workers) as ex:
                results = list(ex.map(lambda item: self._verdict(pool, *item), todo))
            self.cache.update({m.key: r for (m, _), r in zip(todo, results, strict=True)})
        out: list[Verdict | None] = []
        for mutation, _ in items:
            raw = self.cache[mutation.key]
            out.append(None if raw is None else Verdict(tuple(raw[0]), tuple(raw[1])))
        return out

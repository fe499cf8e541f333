"""Bundled task distributions: a config, the tasks of one split, all splits, and the leakage check.

Splits are disjoint by construction: a bundled package's functions are assigned to train / validation / test by
a fixed hash of ``package:file:function`` (the seed only chooses mutants), and procedural modules of different
splits come from different seed streams. :func:`check_leakage` verifies it on the finished task lists.
"""

from __future__ import annotations

import itertools
import sys
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from repro.tasks.bundled import bundled_packages, get_package
from repro.tasks.families import PROCEDURAL, Draft, FamilyOptions, package_drafts, procedural_drafts
from repro.tasks.materialize import REPO_OWNER, CommitSpec, materialize
from repro.tasks.mutate import expand_operators, gold_patch
from repro.tasks.procedural import ProceduralConfig
from repro.tasks.schema import Task

SPLITS = ("train", "validation", "test")
ALL_PACKAGES = "packages"


@dataclass
class TaskDistributionConfig:
    """Which bundled tasks to build.

    ``families``: ``procedural``, ``package:<name>`` or ``packages`` (every bundled package); the tasks are
    shared out evenly between them (a package that runs out leaves its share to the others). ``operators``:
    mutation operators or groups (``repro.tasks.mutate.OPERATOR_GROUPS``), empty = all. ``difficulty``:
    ``one_step`` | ``multi_step`` | ``mixed``. ``split_fractions``: share of each package's functions in
    train / validation / test (fixed hash, independent of the seed).
    """

    seed: int = 0
    split: str = "train"
    n_tasks: int = 100  # <= 0: every task the (bounded) package families have
    families: list[str] = field(default_factory=lambda: [PROCEDURAL])
    operators: list[str] = field(default_factory=list)
    difficulty: str = "one_step"
    split_fractions: list[float] = field(default_factory=lambda: [0.7, 0.1, 0.2])
    procedural: ProceduralConfig = field(default_factory=ProceduralConfig)
    validation_workers: int = 0  # parallel pytest runs validating package mutants (0 = one per CPU)


class LeakageError(ValueError):
    """A mutated function appears both in train and in a held-out split."""


def expand_families(families: Sequence[str]) -> list[str]:
    """``packages`` -> every ``package:<name>``; names are checked."""
    out: list[str] = []
    for family in families:
        if family == ALL_PACKAGES:
            names = [f"package:{name}" for name in bundled_packages()]
        elif family == PROCEDURAL or family.startswith("package:"):
            if family != PROCEDURAL:
                get_package(family.split(":", 1)[1])
            names = [family]
        else:
            raise ValueError(f"unknown task family {family!r}; use {PROCEDURAL!r}, {ALL_PACKAGES!r} or "
                             f"'package:<name>' with a name from {sorted(bundled_packages())}")
        out += [n for n in names if n not in out]
    return out


def _options(cfg: TaskDistributionConfig) -> FamilyOptions:
    if cfg.split not in SPLITS:
        raise ValueError(f"unknown split {cfg.split!r}; choose from {SPLITS}")
    return FamilyOptions(cfg.seed, cfg.split, list(expand_operators(cfg.operators)), cfg.difficulty,
                         list(cfg.split_fractions), cfg.procedural, cfg.validation_workers)


def _stream(family: str, opts: FamilyOptions) -> Iterator[Draft]:
    if family == PROCEDURAL:
        return procedural_drafts(opts)
    return package_drafts(get_package(family.split(":", 1)[1]), opts)


def _take(streams: dict[str, Iterator[Draft]], n: int) -> dict[str, list[Draft]]:
    """Share ``n`` drafts out evenly over the streams; an exhausted stream leaves its share to the others."""
    taken: dict[str, list[Draft]] = {f: [] for f in streams}
    active = list(streams)
    while active and sum(map(len, taken.values())) < n:
        need = n - sum(map(len, taken.values()))
        shares = [need // len(active) + (i < need % len(active)) for i in range(len(active))]
        for family, share in zip(list(active), shares, strict=True):
            got = list(itertools.islice(streams[family], share))
            taken[family] += got
            if len(got) < share:
                active.remove(family)
    return taken


def _commits(drafts: list[Draft]) -> list[CommitSpec]:
    """The clean commit(s) and one commit per task for one repository.

    A task commit is a root commit holding the whole buggy tree: were it parented on its clean commit,
    ``git diff HEAD~1`` in a workspace would print the fix.
    """
    commits: dict[str, CommitSpec] = {}
    base: dict[str, str] = {}
    if drafts[0].family == PROCEDURAL:
        readme = "Procedural bug-fix tasks; each task's state is the commit at refs/tasks/<instance_id>.\n"
        base = {"README.md": readme}
        commits["refs/heads/main"] = CommitSpec("refs/heads/main", base, None, "init")
        for d in drafts:
            commits.setdefault(d.clean_ref, CommitSpec(d.clean_ref, d.clean_files, "refs/heads/main", "module"))
    else:
        commits["refs/heads/main"] = CommitSpec("refs/heads/main", drafts[0].clean_files, None, "clean")
    for d in drafts:
        ref = f"refs/tasks/{d.instance_id}"
        tree = {**base, **d.clean_files, d.mutation.path: d.mutant_source}
        commits.setdefault(ref, CommitSpec(ref, tree, None, "task"))
    return list(commits.values())


def _task(draft: Draft, path: str, shas: dict[str, str]) -> Task:
    m = draft.mutation
    return Task(
        instance_id=draft.instance_id, repo=f"{REPO_OWNER}/{draft.repo_name}",
        base_commit=shas[f"refs/tasks/{draft.instance_id}"], problem_statement=draft.statement,
        patch=gold_patch(m.path, draft.mutant_source, draft.clean_source), test_patch="",
        FAIL_TO_PASS=list(draft.verdict.failing), PASS_TO_PASS=list(draft.verdict.passing), version="1",
        environment_setup_commit=shas[draft.clean_ref], repo_path=path, family=draft.family, operator=m.operator,
        difficulty=draft.difficulty, extra={**draft.extra, "function_key": draft.function_key},
    )


def tasks_from_drafts(drafts: list[Draft]) -> list[Task]:
    """Materialize the drafts' repositories and turn each draft into a Task (same order)."""
    by_repo: dict[str, list[Draft]] = defaultdict(list)
    for d in drafts:
        by_repo[d.repo_name].append(d)
    located = {}
    for name, group in by_repo.items():
        path, shas = materialize(name, _commits(group))
        located[name] = (str(path), shas)
    return [_task(d, *located[d.repo_name]) for d in drafts]


def build_distribution(cfg: TaskDistributionConfig) -> list[Task]:
    """The tasks of ``cfg.split``, with their repositories materialized (same config -> same tasks and shas)."""
    opts = _options(cfg)
    families = expand_families(cfg.families)
    if cfg.n_tasks <= 0 and PROCEDURAL in families:
        raise ValueError("n_tasks <= 0 means 'every task', but the procedural family is unbounded; set n_tasks")
    wanted = cfg.n_tasks if cfg.n_tasks > 0 else sys.maxsize
    streams = {f: _stream(f, opts) for f in families}
    try:
        taken = _take(streams, wanted)
    finally:
        for stream in streams.values():
            stream.close()  # type: ignore[attr-defined]
    total = sum(map(len, taken.values()))
    if cfg.n_tasks > 0 and total < cfg.n_tasks:
        counts = {f: len(d) for f, d in taken.items()}
        raise ValueError(f"only {total} tasks available for split {cfg.split!r} ({counts}); lower n_tasks or "
                         f"add families (e.g. 'procedural', which is unbounded)")
    ordered = [d for batch in itertools.zip_longest(*taken.values()) for d in batch if d is not None]
    return tasks_from_drafts(ordered)


def build_splits(cfg: TaskDistributionConfig, sizes: Mapping[str, int]) -> dict[str, list[Task]]:
    """Every split named in ``sizes`` (split -> number of tasks), checked for leakage."""
    splits = {name: build_distribution(replace(cfg, split=name, n_tasks=n)) for name, n in sizes.items()}
    check_leakage(splits)
    return splits


def check_leakage(splits: Mapping[str, Sequence[Task]], train: str = "train") -> None:
    """Raise LeakageError if a mutated function of ``train`` is mutated in any other split too.

    The key is ``extra['function_key']`` (package + file + function name, or a hash of a procedural
    function's source); tasks without one (e.g. loaded SWE-bench rows) are not compared.
    """
    seen = {t.extra["function_key"]: t.instance_id for t in splits.get(train, []) if t.extra.get("function_key")}
    for name, tasks in splits.items():
        if name == train:
            continue
        shared = [(t.extra["function_key"], seen[t.extra["function_key"]], t.instance_id)
                  for t in tasks if t.extra.get("function_key") in seen]
        if shared:
            lines = "\n".join(f"  {key}: {a} (train) / {b} ({name})" for key, a, b in shared[:20])
            raise LeakageError(f"{len(shared)} task(s) of split {name!r} mutate a function also mutated in "
                               f"{train!r}:\n{lines}")

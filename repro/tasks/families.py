"""Task families: streams of validated mutants (:class:`Draft`) from a bundled package or from procedurally
generated modules, in a seeded order, each with its issue-style problem statement."""

from __future__ import annotations

import hashlib
import itertools
import random
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.tasks.bundled import BundledPackage, PytestValidator, Verdict, write_tree
from repro.tasks.mutate import Mutation, Mutator, find_mutations, function_names
from repro.tasks.probe import Symptom, probe_test
from repro.tasks.procedural import (
    ProceduralConfig,
    ProceduralModule,
    generate_module,
    module_seed,
    run_cases,
    symptom,
    verdict,
)
from repro.tasks.statements import DIFFICULTIES, LOCATE, MIXED_CHOICES, make_statement

PROCEDURAL = "procedural"
MAX_BARREN_MODULES = 200  # procedural modules in a row without a usable mutant before giving up


@dataclass
class Draft:
    """A validated mutant with its statement, before its commit exists."""

    family: str
    repo_name: str
    clean_ref: str
    clean_files: dict[str, str]
    mutation: Mutation
    mutant_source: str
    verdict: Verdict
    difficulty: str
    statement: str
    function_key: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def clean_source(self) -> str:
        return self.clean_files[self.mutation.path]

    @property
    def instance_id(self) -> str:
        tag = {"one_step": "1s", "one_step_brief": "1b", "locate": "lc"}.get(self.difficulty, "ms")
        func, key = self.mutation.function, self.mutation.key
        if self.family == PROCEDURAL:  # module and function names repeat across modules: the seed tells them apart
            func = f"{self.mutation.path.removesuffix('.py')}.{func}"
            key = hashlib.sha256(f"{key}:{self.extra['module_seed']}".encode()).hexdigest()
        return f"repro-bundled__{self.repo_name}-{func}-{self.mutation.operator}-{tag}-{key[:8]}"


def stable_hash(*parts: object) -> int:
    return int(hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()[:16], 16)


def assign_splits(keys: list[str], fractions: list[float]) -> dict[str, str]:
    """train / validation / test for each function key: keys ranked by a fixed hash (independent of the seed)
    and cut by ``fractions``; each held-out split gets at least one key when there are three or more."""
    ranked = sorted(keys, key=lambda k: stable_hash("split", k))
    total = sum(fractions)
    n_val = round(len(ranked) * fractions[1] / total)
    n_test = round(len(ranked) * fractions[2] / total)
    if len(ranked) >= 3:
        n_val, n_test = max(n_val, 1), max(n_test, 1)
    n_train = len(ranked) - n_val - n_test
    names = ["train"] * n_train + ["validation"] * n_val + ["test"] * n_test
    return dict(zip(ranked, names, strict=True))


def stratified(mutations: list[Mutation], rng: random.Random) -> list[Mutation]:
    """Seeded order that rotates over functions and, within each, over operators (so no function or
    operator with many candidates crowds out the others)."""
    groups: dict[str, dict[str, list[Mutation]]] = defaultdict(lambda: defaultdict(list))
    for m in mutations:
        groups[m.function][m.operator].append(m)
    queues = []
    for func in sorted(groups):
        lists = [groups[func][op] for op in sorted(groups[func])]
        for items in lists:
            rng.shuffle(items)
        rng.shuffle(lists)
        queues.append([m for batch in itertools.zip_longest(*lists) for m in batch if m is not None])
    rng.shuffle(queues)
    return [m for batch in itertools.zip_longest(*queues) for m in batch if m is not None]


def pick_difficulty(difficulty: str, seed: int, mutation: Mutation) -> str:
    """The task's difficulty: ``mixed`` draws from :data:`MIXED_CHOICES`, ``a+b`` from the difficulties it lists
    (a fixed hash of the mutation, so a task keeps its draw)."""
    choices = MIXED_CHOICES if difficulty == "mixed" else tuple(difficulty.split("+"))
    unknown = [c for c in choices if c not in DIFFICULTIES]
    if unknown:
        raise ValueError(f"unknown difficulty {unknown[0]!r}; choose from {[*DIFFICULTIES, 'mixed']} or join "
                         "several with '+'")
    return choices[stable_hash("difficulty", seed, mutation.key) % len(choices)] if len(choices) > 1 else choices[0]


@dataclass(frozen=True)
class Origin:
    """Where drafts come from: family, repository, the clean commit's ref and files, statement style."""

    family: str
    repo_name: str
    clean_ref: str
    files: dict[str, str]
    quote_line: bool


@dataclass
class FamilyOptions:
    """What every family needs from the distribution config."""

    seed: int
    split: str
    operators: list[str]
    difficulty: str
    split_fractions: list[float]
    procedural: ProceduralConfig
    workers: int = 0


def _bundled_symptom(package: BundledPackage, files: dict[str, str], failing: tuple[str, ...],
                     function: str) -> Symptom | None:
    """The first observable symptom, preferring tests named after the mutated function."""
    name = function.rsplit(".", 1)[-1]
    ordered = sorted(failing, key=lambda t: name not in t.split("::")[-1])
    with tempfile.TemporaryDirectory(prefix="repro-probe-") as tmp:
        write_tree(Path(tmp), files)
        for test_id in ordered:
            found = probe_test(Path(tmp), test_id, [package.name])
            if found is not None:
                return found
    return None


def package_drafts(package: BundledPackage, opts: FamilyOptions) -> Iterator[Draft]:
    """Validated mutants of the package's functions assigned to ``opts.split`` (pytest decides)."""
    files = package.files()
    family = f"package:{package.name}"
    keys = {f"{family}:{path}:{f}": (path, f) for path in package.modules() for f in function_names(files[path])}
    splits = assign_splits(list(keys), opts.split_fractions)
    candidates = []
    for path in package.modules():
        mine = [f for key, (p, f) in keys.items() if p == path and splits[key] == opts.split]
        candidates += find_mutations(files[path], path, opts.operators, mine)
    order = stratified(candidates, random.Random(stable_hash(opts.seed, family, opts.split)))
    origin = Origin(family, package.name, "refs/heads/main", files, quote_line=False)
    validator = PytestValidator(package, opts.workers)
    batch = 2 * validator.workers
    try:
        for start in range(0, len(order), batch):
            items = [(m, s) for m in order[start:start + batch] if (s := m.try_apply(files[m.path])) is not None]
            for (mutation, mutant), found in zip(items, validator.verdicts(items), strict=True):
                if found is None or not found.keeps:
                    continue
                observed = _bundled_symptom(package, {**files, mutation.path: mutant}, found.failing, mutation.function)
                draft = _draft(origin, mutation, mutant, found, observed, opts)
                if draft is not None:
                    yield draft
    finally:
        validator.save()


def _draft(origin: Origin, mutation: Mutation, mutant: str, found: Verdict, observed: Symptom | None,
           opts: FamilyOptions, key: str = "") -> Draft | None:
    """A Draft, or None when the symptom cannot be observed or a multi-step statement would quote the fault."""
    if observed is None:
        return None
    difficulty = pick_difficulty(opts.difficulty, opts.seed, mutation)
    files = origin.files
    statement = make_statement(difficulty, observed, mutation, files[mutation.path], origin.quote_line)
    if statement is None:
        return None
    extra = {"split": opts.split, "seed": opts.seed, "file": mutation.path, "function": mutation.function,
             "line": mutation.lineno, "buggy_line": mutation.buggy_line(files[mutation.path]),
             "fixed_line": mutation.fixed_line(files[mutation.path]), "mutation_key": mutation.key}
    if difficulty == LOCATE:  # the expert's check before it submits (other distributions keep their rows)
        extra["check"] = observed.assertion()
    return Draft(origin.family, origin.repo_name, origin.clean_ref, files, mutation, mutant, found, difficulty,
                 statement, key or f"{origin.family}:{mutation.path}:{mutation.function}", extra)


def function_source_key(text: str) -> str:
    """Leakage key of a procedural function: a hash of its source text (name, parameters and body)."""
    return f"{PROCEDURAL}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _first_usable(module: ProceduralModule, origin: Origin, mutations: list[Mutation],
                  opts: FamilyOptions, key: str) -> Draft | None:
    for mutation in mutations:
        mutant = mutation.apply(module.source)
        outcomes = run_cases(module, mutant)
        if outcomes is None:
            continue
        found = verdict(module, outcomes)
        if not found.keeps:
            continue
        draft = _draft(origin, mutation, mutant, found, symptom(module, outcomes, found.failing[0]), opts, key)
        if draft is not None:
            draft.extra["module_seed"] = module.seed
            return draft
    return None


def _module_drafts(module: ProceduralModule, opts: FamilyOptions, repo_name: str) -> Iterator[Draft]:
    """At most ``tasks_per_module`` drafts, each mutating a different function (in a seeded order)."""
    digest = hashlib.sha256(module.source.encode() + module.test_source.encode()).hexdigest()[:10]
    origin = Origin(PROCEDURAL, repo_name, f"refs/clean/{module.name}-{digest}", module.files(), quote_line=True)
    rng = random.Random(module.seed)
    mutator = Mutator(module.source, module.path)
    functions = mutator.functions()
    rng.shuffle(functions)
    made = 0
    for function in functions:
        if made >= opts.procedural.tasks_per_module:
            return
        order = stratified(mutator.mutations(function, opts.operators), rng)
        draft = _first_usable(module, origin, order, opts, function_source_key(mutator.function_source(function)))
        if draft is not None:
            made += 1
            yield draft


def procedural_drafts(opts: FamilyOptions) -> Iterator[Draft]:
    """An unbounded stream of procedural tasks for (seed, split); module i depends only on (seed, split, i)."""
    repo_name = f"procedural-s{opts.seed}-{opts.split}"
    barren = 0
    for index in itertools.count():
        module = generate_module(module_seed(opts.seed, opts.split, index), opts.procedural)
        produced = False
        for draft in _module_drafts(module, opts, repo_name):
            produced = True
            yield draft
        barren = 0 if produced else barren + 1
        if barren >= MAX_BARREN_MODULES:
            raise RuntimeError(f"{MAX_BARREN_MODULES} procedural modules in a row gave no task for operators "
                               f"{opts.operators or 'all'}; widen the operator selection")

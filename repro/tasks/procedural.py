"""The procedural family: small modules generated from a seed, with generated pytest tests.

A module has 3-6 small integer functions named by random one-syllable words (parameters and locals too),
with constants, arithmetic and comparisons, an optional loop and an optional early return; a function may
call an earlier one. Expected test values come from running the clean code. Mutants are validated in-process
(calling the functions on the test inputs), which agrees with real pytest (checked by a test) and is far faster.
"""

from __future__ import annotations

import builtins
import hashlib
import keyword
import random
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from repro.tasks.bundled import Verdict
from repro.tasks.probe import Symptom, show, show_error

_WORD_TEXT = """
bark bell bend bind blip blot bog bolt bone boot bowl brim buck bulb bump bunk burn bush buzz cake camp cane
cape cart cave chip chop clam clap claw clay clod clog coal coat coin colt cone cord cork corn crab crow cube
cuff curl dart dawn deck deer dent dime dirt dish dock dome dove drum duck dune dusk fang fawn fern fig fish
flag flap flax flea flint flock fog foil fork fort fox frog gap gasp glen glow glue goat gong grain grape grip
gull gust hail ham hare harp hawk heap helm hen herb hill hive hog hook horn hose hound hump hut jam jar jaw
jig kelp kid kiln kit knob knot lamb lamp lark latch leaf leek lime lint loft loom lure lynx mast mat maze mesh
mill mint mist moat mole moth mound mud mug mule nail nest newt nook nut oak oat orb owl pail palm peak pear peg
pelt pest pike pine pit plank plum pod pond pork prawn pug pump quail quill raft rail rake ram rat reed reef rib
rind rock roof rook rope rug rust sack sage sail sand scab scarf seal seed shed shell ship shoe shrub silk skate
skull slab sled slug smock snail spade spark spoon stag stem stork straw stump swan tack tar tent thorn toad
tomb tongs torch trout tub tusk twig urn vane vase vest vine vole wasp wand weed whale wheat whisk wick wig wisp
wolf worm wren yak yarn yolk zinc
"""
_RESERVED = set(keyword.kwlist) | set(dir(builtins)) | set(sys.stdlib_module_names) | {"conftest", "pytest", "tests"}
WORDS = tuple(w for w in _WORD_TEXT.split() if w not in _RESERVED)
CMP = ("<", "<=", ">", ">=", "==", "!=")
CASE_BUDGET_S = 1.0  # all test cases of one module, in-process


@dataclass
class ProceduralConfig:
    """Shape of generated modules and how many tasks to draw from each."""

    min_functions: int = 3
    max_functions: int = 6
    cases_per_function: int = 3  # generated pytest tests per function
    tasks_per_module: int = 2  # mutants drawn from one module (at most one per function)
    loop_probability: float = 0.3
    branch_probability: float = 0.6
    call_probability: float = 0.2  # a term calls an earlier function of the module


@dataclass(frozen=True)
class Case:
    """One generated test: ``assert function(*args) == expected``."""

    test_id: str
    function: str
    args: tuple[int, ...]
    expected: Any


@dataclass
class ProceduralModule:
    name: str
    source: str
    test_source: str
    cases: list[Case]
    seed: int
    functions: list[str] = field(default_factory=list)

    @property
    def path(self) -> str:
        return f"{self.name}.py"

    @property
    def test_path(self) -> str:
        return f"tests/test_{self.name}.py"

    def files(self) -> dict[str, str]:
        """The repository tree of this module (the empty conftest puts the root on sys.path)."""
        return {self.path: self.source, self.test_path: self.test_source, "conftest.py": ""}


def module_seed(seed: int, split: str, index: int) -> int:
    """The seed of module ``index`` in the stream of (seed, split): splits never share a module seed."""
    return int(hashlib.sha256(f"procedural:{seed}:{split}:{index}".encode()).hexdigest()[:16], 16)


class _Writer:
    """Writes one function's lines with fresh names."""

    def __init__(self, rng: random.Random, cfg: ProceduralConfig, taken: set[str],
                 earlier: list[tuple[str, int]]) -> None:
        self.rng, self.cfg, self.taken, self.earlier = rng, cfg, taken, earlier
        self.unused: set[str] = set()

    def fresh(self) -> str:
        name = self.rng.choice(WORDS)
        while name in self.taken:
            name = self.rng.choice(WORDS)
        self.taken.add(name)
        return name

    def term(self, names: list[str], name: str | None = None) -> str:
        """A name, a constant, ``name * c``, ``name // c``, ``name % c`` or a call (``name`` forces a name)."""
        rng = self.rng
        roll = rng.random()
        if name is None and self.earlier and roll < self.cfg.call_probability:
            func, arity = rng.choice(self.earlier)
            return f"{func}({', '.join(rng.choice([*names, str(rng.randint(1, 9))]) for _ in range(arity))})"
        if name is None and 0.55 <= roll < 0.7:
            return str(rng.randint(1, 9))
        name = name or rng.choice(names)
        self.unused.discard(name)
        if roll < 0.7:
            return name
        if roll < 0.88:
            return f"{name} * {rng.randint(2, 5)}"
        return f"{name} {rng.choice(['//', '%'])} {rng.randint(2, 5)}"

    def expr(self, names: list[str], terms: int = 0, first: tuple[str, ...] = ()) -> str:
        """``terms`` terms joined by + / -, starting with the names in ``first`` (at least one name)."""
        count = max(terms or self.rng.randint(2, 3), len(first))
        heads = list(first) or [self.rng.choice(names)]
        parts = [self.term(names, n) for n in heads]
        parts += [self.term(names) for _ in range(count - len(parts))]
        out = parts[0]
        for part in parts[1:]:
            out += f" {self.rng.choice('+-')} {part}"
        return out

    def cond(self, names: list[str]) -> str:
        right = self.rng.choice([str(self.rng.randint(0, 9)), self.rng.choice(names)])
        return f"{self.rng.choice(names)} {self.rng.choice(CMP)} {right}"

    def assign(self, var: str, names: list[str], indent: str = "    ") -> str:
        recent = sorted(self.unused & set(names), key=names.index)[-1:]
        line = f"{indent}{var} = {self.expr(names, first=tuple(recent))}"
        self.unused.add(var)
        return line

    def function(self, name: str) -> tuple[list[str], int]:
        rng = self.rng
        params = [self.fresh() for _ in range(rng.randint(1, 3))]
        self.unused = set(params)
        names = list(params)
        lines = [f"def {name}({', '.join(params)}):"]
        for _ in range(rng.randint(1, 2)):
            var = self.fresh()
            lines.append(self.assign(var, names))
            names.append(var)
        if rng.random() < self.cfg.loop_probability:
            acc, idx = self.fresh(), self.fresh()
            bound = rng.randint(2, 5)  # constant: generated code stays fast whatever a mutant does
            body = self.expr([*names, idx], 2, first=(idx,))
            lines += [f"    {acc} = {rng.randint(0, 3)}", f"    for {idx} in range({bound}):",
                      f"        {acc} = {acc} {rng.choice('+-')} {body}"]
            names.append(acc)
            self.unused.add(acc)
        if rng.random() < self.cfg.branch_probability:
            lines += [f"    if {self.cond(names)}:", f"        return {self.expr(names)}"]
        lines.append(f"    return {self.expr(names, first=tuple(n for n in names if n in self.unused))}")
        return lines, len(params)


def _cases(rng: random.Random, module: str, funcs: list[tuple[str, int]], ns: dict[str, Any],
           per_function: int) -> list[Case]:
    cases = []
    for func, arity in funcs:
        seen: set[tuple[int, ...]] = set()
        while len(seen) < per_function:
            args = tuple(rng.randint(-3, 9) for _ in range(arity))
            if args in seen:
                continue
            seen.add(args)
            test_id = f"tests/test_{module}.py::test_{func}_{len(seen)}"
            cases.append(Case(test_id, func, args, ns[func](*args)))
    return cases


def _test_source(module: str, funcs: list[str], cases: list[Case]) -> str:
    lines = [f"from {module} import {', '.join(sorted(funcs))}"]
    for case in cases:
        name = case.test_id.split("::")[1]
        lines += ["", "", f"def {name}():", f"    assert {case.function}({', '.join(map(str, case.args))}) == "
                  f"{case.expected!r}"]
    return "\n".join(lines) + "\n"


def generate_module(seed: int, cfg: ProceduralConfig | None = None) -> ProceduralModule:
    """One module with its tests, entirely determined by ``seed`` and ``cfg``."""
    cfg = cfg or ProceduralConfig()
    rng = random.Random(seed)
    taken: set[str] = set()
    writer = _Writer(rng, cfg, taken, [])
    name = writer.fresh()
    funcs: list[tuple[str, int]] = []
    chunks = []
    for _ in range(rng.randint(cfg.min_functions, cfg.max_functions)):
        func = writer.fresh()
        lines, arity = writer.function(func)
        chunks.append("\n".join(lines))
        funcs.append((func, arity))
        writer.earlier = list(funcs)
    source = "\n\n\n".join(chunks) + "\n"
    ns: dict[str, Any] = {}
    exec(compile(source, f"{name}.py", "exec"), ns)
    with time_limit(CASE_BUDGET_S):
        cases = _cases(rng, name, funcs, ns, cfg.cases_per_function)
    names = [f for f, _ in funcs]
    return ProceduralModule(name, source, _test_source(name, names, cases), cases, seed, names)


class TooSlow(BaseException):  # not caught by the `except Exception` around each case
    """Generated code ran past its time budget."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise TooSlow in the block after ``seconds`` (a guard; only enforced on the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise TooSlow(f"generated code ran over {seconds}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_cases(module: ProceduralModule, source: str) -> dict[str, Any] | None:
    """Each case's returned value (or raised exception) under ``source``; None when it does not compile or
    runs too long."""
    try:
        code = compile(source, module.path, "exec")
    except SyntaxError:
        return None
    ns: dict[str, Any] = {}
    exec(code, ns)
    out: dict[str, Any] = {}
    try:
        with time_limit(CASE_BUDGET_S):
            for case in module.cases:
                try:
                    out[case.test_id] = ns[case.function](*case.args)
                except Exception as exc:
                    out[case.test_id] = exc
    except TooSlow:
        return None
    return out


def _fails(case: Case, got: Any) -> bool:
    return isinstance(got, Exception) or got != case.expected


def verdict(module: ProceduralModule, outcomes: dict[str, Any]) -> Verdict:
    """Which generated tests fail given ``run_cases`` outcomes (the in-process stand-in for pytest)."""
    failing = tuple(c.test_id for c in module.cases if _fails(c, outcomes[c.test_id]))
    return Verdict(failing, tuple(c.test_id for c in module.cases if c.test_id not in failing))


def symptom(module: ProceduralModule, outcomes: dict[str, Any], test_id: str) -> Symptom:
    """What the failing test's call does under the mutant: "`zag(3, 4)` returns `5`, expected `9`"."""
    case = next(c for c in module.cases if c.test_id == test_id)
    got = outcomes[test_id]
    call = f"{case.function}({', '.join(map(str, case.args))})"
    observed = f"raises `{show_error(got)}`" if isinstance(got, Exception) else f"returns `{show(got)}`"
    return Symptom(test_id, call, observed, f"`{show(case.expected)}`",
                   imports=(f"from {module.name} import {case.function}",))

"""Package layering, held by structure: no import cycle between modules or packages (imports inside functions and
plugins named by string count), every import goes down the layers of ``docs/architecture.md``'s dependency picture,
and the specific rules below it."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SOURCES = ("repro", "harness_adapters")
PLUGIN = re.compile(r"^(repro(?:\.\w+)+):\w+$")  # "package.module:function", loaded by name (a plugin)

# docs/architecture.md, "Layers": a package imports only from its own layer or the ones above it in this list
LAYERS: list[tuple[str, set[str]]] = [
    ("leaves", {"common", "execution", "conf"}),
    ("data", {"store", "tasks"}),
    ("contracts and the recording path", {"protocols", "proxy"}),
    ("harnesses and sandboxes", {"harness_adapters", "sandbox"}),
    ("models", {"tinymodel", "serving", "testing"}),
    ("evaluation and training", {"evaluation", "train", "verl"}),
    ("the loop", {"rl"}),
    ("the recipe's building blocks", {"recipe"}),
    ("experiments and tools", {"experiments", "report", "cli"}),
    ("the public API", {"repro"}),  # repro/__init__.py: names from every layer, for users (nothing in repro imports it)
]
LAYER_OF = {package: i for i, (_, packages) in enumerate(LAYERS) for package in packages}


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at top level or inside functions (lazy imports count), and every module a string
    constant names as a plugin (``"repro.tinymodel.expert:serving_script"``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:  # module.name: a submodule, or
            names.update(f"{node.module}.{alias.name}" for alias in node.names)  # an attribute of module
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (m := PLUGIN.match(node.value)):
            names.add(m.group(1))
    return names


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str:
    """``repro.serving.stack`` -> ``serving``; ``repro`` -> ``repro``; any harness adapter -> ``harness_adapters``."""
    parts = module.split(".")
    return parts[0] if parts[0] != "repro" or len(parts) == 1 else parts[1]


def module_graph() -> dict[str, set[str]]:
    """Module -> the modules of this repository it imports (``a.b.name``: the module ``a.b.name`` if there is one,
    else ``a.b``)."""
    files = {module_name(p): p for top in SOURCES for p in sorted((ROOT / top).rglob("*.py"))}

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    return {m: {t for name in imported_modules(p) if (t := resolve(name)) and t != m} for m, p in files.items()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (its nodes in order), or None (depth-first search, iterative)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph.get(start, ())))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        out.setdefault(package_of(module), set()).update(package_of(t) for t in targets)
    return {p: t - {p} for p, t in out.items()}


GRAPH = module_graph()


def test_no_import_cycle_between_modules() -> None:
    assert cycle(GRAPH) is None, " -> ".join(cycle(GRAPH) or [])


def test_no_import_cycle_between_packages() -> None:
    packages = package_graph(GRAPH)
    assert cycle(packages) is None, " -> ".join(cycle(packages) or [])


def test_every_package_has_a_layer() -> None:
    assert set(package_graph(GRAPH)) <= set(LAYER_OF), set(package_graph(GRAPH)) - set(LAYER_OF)


def offenders(graph: dict[str, set[str]]) -> Iterable[str]:
    for module, targets in graph.items():
        for target in targets:
            low, high = package_of(module), package_of(target)
            if LAYER_OF[high] > LAYER_OF[low]:
                yield f"{module} ({LAYERS[LAYER_OF[low]][0]}) imports {target} ({LAYERS[LAYER_OF[high]][0]})"


def test_every_import_goes_down_the_layers() -> None:
    assert not list(offenders(GRAPH))


@pytest.mark.parametrize(("package", "forbidden"), [
    ("harness_adapters", "repro.serving"),
    ("harness_adapters", "repro.tinymodel"),
    ("harness_adapters", "repro.sandbox"),
    ("repro/serving", "repro.testing"),
    ("repro/tinymodel", "repro.serving"),  # the tiny model and the scripted expert (loaded by name) know no server
    ("repro/sandbox", "repro.evaluation"),
    ("repro/tasks", "repro.sandbox"),
    ("repro/execution", "repro.sandbox"),
    ("repro/execution", "repro.tasks"),
    ("repro/train", "repro.serving"),  # the update knows no server: weight sync is repro.serving.sync's
    ("repro/train/samples", "repro.train.rl"),  # calls -> rows knows nothing of the update that uses them
    ("repro/rl", "repro.report"),  # the loop prints through repro.common.progress, never through the report tools
])
def test_package_does_not_import(package: str, forbidden: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, package
    found = [f"{path.relative_to(ROOT)} imports {name}" for path in files for name in imported_modules(path)
             if name == forbidden or name.startswith(forbidden + ".")]
    assert not found, found


def test_only_tests_and_benchmarks_reach_the_fakes() -> None:
    users = {m for m, targets in GRAPH.items() for t in targets if t.startswith("repro.testing")}
    assert all(m.startswith(("repro.testing", "repro.experiments.bench")) for m in users), users


def test_the_checker_sees_lazy_imports_plugins_and_cycles(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from repro.serving.stack import Stack\n    import repro.serving.engine\n"
                      "PLUGIN = 'repro.tinymodel.expert:serving_script'\n")
    assert imported_modules(module) == {"repro.serving.stack.Stack", "repro.serving.engine",
                                         "repro.tinymodel.expert"}
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    assert list(offenders({"repro.store.x": {"repro.rl.trainer"}}))  # an import up the layers is named


def test_modules_share_a_file_name_only_where_the_architecture_lists_it() -> None:
    """A file name says what a module holds: two modules of ``repro/`` share one only if docs/architecture.md lists
    it (the same kind of thing in sibling packages)."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    listed = set(re.findall(r"`(\w+\.py)`", doc.split("Shared file names:", 1)[1].split("\n\n", 1)[0]))
    names: dict[str, list[str]] = {}
    for path in sorted((ROOT / "repro").rglob("*.py")):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    shared = {name: paths for name, paths in names.items() if len(paths) > 1}
    assert {"config.py", "__init__.py"} <= listed
    assert set(shared) <= listed, {name: shared[name] for name in set(shared) - listed}


def test_each_experiment_is_one_file_that_imports_no_other_experiment() -> None:
    """``repro/experiments/X.py`` is one readable experiment: what experiments share lives in ``repro/recipe/``."""
    experiments = {m for m in GRAPH
                   if m.startswith("repro.experiments.") and not m.startswith("repro.experiments.bench")}
    assert len(experiments) >= 8
    found = {m: sorted(t for t in GRAPH[m] if t in experiments) for m in experiments}
    assert not {m: ts for m, ts in found.items() if ts}
    assert "repro.recipe.miniature" in GRAPH["repro.experiments.mini_repro"]  # the checker sees the shared code

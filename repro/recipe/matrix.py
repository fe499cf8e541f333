"""A matrix's preparation, shared by the experiments that train in several harnesses: the harnesses, one recipe
tokenizer with every harness's fixed texts, the mixed warm start, each harness's frozen spec
(:func:`prepared_matrix`); :class:`MatrixConfig` names the harnesses and the arms trained in them."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness_adapters.registry import get_harness, name_for_config
from repro.common.accounting import Accountant
from repro.recipe.harness_texts import harness_texts
from repro.recipe.miniature import Miniature, MiniatureConfig, split_train
from repro.recipe.warm_start import WarmStartRun
from repro.recipe.warm_start_mix import mixed_warm_start
from repro.rl.evaluator import build_spec, evaluate_or_refuse
from repro.rl.rollouts import GradeCache
from repro.sandbox.select import make_sandbox
from repro.tasks.sets import load_task_set
from repro.tinymodel.recipe import RecipeHarness, build_recipe_model
from repro.tinymodel.vocab import recipe_added_tokens

REBUILT = "rebuilt"


@dataclass
class MatrixConfig:
    """The harnesses of the matrix (name -> harness config): the model's demonstrations run through each and every
    policy is evaluated in each. ``train_in``: the harnesses RL trains in through the proxy; ``rebuilt_of``: a
    harness whose loop the trainer-owned rebuild runs as one more arm (empty: none); ``loop_table``: the table of
    the proxy-vs-rebuilt slice of ``rebuilt_of`` (a ``loop_comparison`` record; empty: not written)."""

    harnesses: dict[str, Any] = field(default_factory=dict)
    train_in: list[str] = field(default_factory=list)
    rebuilt_of: str = ""
    harness_workers: int = 2
    loop_table: str = "loop_comparison"

    def __post_init__(self) -> None:
        unknown = [n for n in [*self.train_in, *([self.rebuilt_of] if self.rebuilt_of else [])]
                   if n not in self.harnesses]
        if unknown or not self.harnesses:
            raise ValueError(f"matrix: {unknown or 'no harnesses'} not among matrix.harnesses "
                             f"({sorted(self.harnesses)})")
        if REBUILT in self.harnesses:
            raise ValueError(f"matrix.harnesses: {REBUILT!r} names the rebuilt-loop arm, not a harness")

    @property
    def arms(self) -> list[tuple[str, str, str]]:
        """(arm name, the harness it trains in, its loop kind)."""
        proxy = [(name, name, "proxy") for name in self.train_in]
        return proxy + ([(REBUILT, self.rebuilt_of, REBUILT)] if self.rebuilt_of else [])


class HarnessSet:
    """Several harnesses as one recipe harness: the tokenizer gets every harness's fixed texts. mini-SWE-agent's
    configs hand theirs out (their tools one block); a harness whose prompts are built inside it (OpenCode,
    OpenHands, the CLIs) gives its captured texts (:mod:`repro.recipe.harness_texts`) with its own tools block and
    call wrappers already made texts, since each harness offers its own tools."""

    def __init__(self, configs: list[Any], captured: list[Any] = ()) -> None:
        self.configs, self.captured = configs, list(captured)

    def fixed_prompt_texts(self, platform_line: bool = False) -> list[str]:
        texts = {t for cfg in self.configs for t in cfg.fixed_prompt_texts(platform_line=platform_line)}
        texts |= {t for c in self.captured for t in recipe_added_tokens(c.fixed_prompt_texts(), c.tools())}
        return sorted(texts)

    def tools(self) -> list[dict[str, Any]]:
        seen = {json.dumps(tool, sort_keys=True): tool for cfg in self.configs for tool in cfg.tools()}
        return [seen[k] for k in sorted(seen)]


def recipe_harness_set(agents: dict[str, Any], configs: dict[str, Any]) -> HarnessSet:
    """The matrix's harnesses as one :class:`HarnessSet`: mini-SWE-agent's configs as they are, the others'
    texts captured from their requests (cached per identity)."""
    own = [cfg for cfg in configs.values() if isinstance(cfg, RecipeHarness)]
    captured = [harness_texts(name_for_config(cfg), cfg, agents[name].identity())
                for name, cfg in configs.items() if not isinstance(cfg, RecipeHarness)]
    return HarnessSet(own, captured)


@dataclass
class Matrix:
    """A prepared matrix: one :class:`Miniature` per harness (its live harness and frozen spec), sharing the task
    sets, the sandbox, the warm start and the grades."""

    minis: dict[str, Miniature]
    run_dir: Path
    acct: Accountant

    @property
    def any(self) -> Miniature:
        return next(iter(self.minis.values()))

    def evaluate_all(self, stack: Any, phase_dir: Path, label: str) -> dict[str, list[Any]]:
        """``stack``'s model evaluated in every harness (``phase_dir/<harness>``)."""
        store = Path(stack.proxy.store_path)
        return {name: evaluate_or_refuse(mini.evaluator(stack, store), mini.test_list, phase_dir / name, label)
                for name, mini in self.minis.items()}


def first_harness_base(model: Any, matrix: MatrixConfig, train_list: list[Any], ws: Any) -> Path | None:
    """The first harness's own recipe model (the one its single-harness run builds), when the mixed warm start
    starts from that harness's warm start (``warm_start.mix_init: first_harness``); else None."""
    if ws.mix_init != "first_harness":
        return None
    first = next(iter(matrix.harnesses.values()))
    if not isinstance(first, RecipeHarness):
        raise ValueError("warm_start.mix_init=first_harness starts from a mini-SWE-agent warm start: list a "
                         "mini-SWE-agent harness first in matrix.harnesses")
    return build_recipe_model(model, first, train_list, platform_line=bool(getattr(first, "platform", None)))


@contextlib.contextmanager
def prepared_matrix(cfg: MiniatureConfig, matrix: MatrixConfig, run_dir: Path) -> Iterator[Matrix]:
    """Task sets, every harness live, the recipe model, the mixed warm start and each harness's frozen spec."""
    run_dir, acct, setup = Path(run_dir), Accountant(), cfg.setup
    with acct.phase("setup"):
        train_name, train_list = load_task_set(cfg.train_tasks)
        test_name, test_list = load_task_set(cfg.tasks)
        demo_tasks, rl_tasks = split_train(train_list, cfg.warm_start.n_demo_tasks)
    box = make_sandbox(setup.sandbox)
    try:
        with contextlib.ExitStack() as stack:
            agents = {name: stack.enter_context(get_harness(None, hcfg, workers=matrix.harness_workers))
                      for name, hcfg in matrix.harnesses.items()}
            harnesses = recipe_harness_set(agents, matrix.harnesses)
            with acct.phase("setup"):  # pinned platform lines (harness.platform) are recipe tokens on every machine
                base = build_recipe_model(setup.model, harnesses, train_list,
                                          platform_line=all(getattr(c, "platform", None) for c in harnesses.configs))
                first = first_harness_base(setup.model, matrix, train_list, cfg.warm_start)
            runs = [WarmStartRun(dataclasses.replace(setup, harness=matrix.harnesses[n]), agent, box,
                                 run_dir / f"demos_{n}") for n, agent in agents.items()]
            warm_dir, warm = mixed_warm_start(runs, base, demo_tasks, cfg.warm_start, acct, first)
            note = "reused from the cache" if warm["cached"] else f"built from {warm['demo_rollouts']} demonstrations"
            print(f"warm start {warm['key']}: {note}, weights sha256 {warm['weights_sha256'][:12]}", flush=True)
            grades, minis = GradeCache(), {}
            for name, agent in agents.items():
                mini_cfg = dataclasses.replace(cfg, setup=dataclasses.replace(setup, harness=matrix.harnesses[name]))
                spec = build_spec(agent, test_name, test_list, setup.sandbox, cfg.eval, cfg.tasks.seed,
                                  setup.served_model_name)
                minis[name] = Miniature(mini_cfg, run_dir, acct, train_name, test_list, rl_tasks, agent, box,
                                        warm_dir, warm, spec, grades)
            yield Matrix(minis, run_dir, acct)
    finally:
        box.close()

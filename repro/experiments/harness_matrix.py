"""``experiment=harness_matrix``: train in each harness (and in the rebuilt loop), evaluate in each.

One warm start that acts in every harness of the matrix (a tokenizer with every harness's fixed texts, the expert's
demonstrations through each: :mod:`repro.recipe.warm_start_mix`), evaluated in each harness; then one RL arm
per training loop (``matrix.train_in``: a harness behind the proxy; ``matrix.rebuilt_of``: the trainer-owned rebuild
of that harness's loop), each from that warm start on the same tasks, seeds and budget, and every trained policy
evaluated in every harness under that harness's frozen spec. ``metrics.json`` has kind ``harness_matrix``;
``repro table`` publishes ``results/<experiment>.md`` (trained in x evaluated in, pooled over seeds).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness_adapters.registry import get_harness, name_for_config
from repro.common.accounting import Accountant
from repro.common.configs import split_table_name
from repro.common.files import weights_sha256
from repro.common.tracking import tracked
from repro.evaluation import eval_metrics, write_metrics
from repro.evaluation.habits import slip_share
from repro.recipe.harness_texts import harness_texts
from repro.recipe.loop_fidelity import FidelityConfig, comparison_metrics, replay_store
from repro.recipe.miniature import Miniature, MiniatureConfig, split_train
from repro.recipe.paired_metrics import paired_tests, per_instance
from repro.recipe.warm_start import WarmStartRun
from repro.recipe.warm_start_mix import mixed_warm_start
from repro.rl.checkpoints import stage_policy
from repro.rl.config import RLConfig
from repro.rl.evaluator import Evaluator, build_spec, refuse_if_all_infra
from repro.rl.loop import RLLoop
from repro.rl.rebuilt.harness import LoopConfig, rl_harness
from repro.rl.rollouts import GradeCache
from repro.sandbox.select import make_sandbox
from repro.tasks.sets import load_task_set
from repro.tinymodel.recipe import RecipeHarness, build_recipe_model
from repro.tinymodel.vocab import recipe_added_tokens

REBUILT = "rebuilt"
LOOP_SLICE = "loop_comparison"  # the folder of the proxy-vs-rebuilt slice of a matrix run


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
        out = {}
        for name, mini in self.minis.items():
            store = Path(stack.proxy.store_path)
            reports = Evaluator(stack, mini.agent, mini.box, mini.cfg.eval, spec=mini.spec, store_path=store,
                                grades=mini.grades).evaluate(mini.test_list, phase_dir / name, label).reports
            refuse_if_all_infra(reports, phase_dir / name)
            out[name] = reports
        return out


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


def train_arm(matrix: Matrix, arm: tuple[str, str, str], rl: RLConfig) -> dict[str, Any]:
    """RL from the warm start in the arm's loop, then the trained policy evaluated in every harness."""
    name, trained_in, kind = arm
    mini, started, acct = matrix.minis[trained_in], time.time(), Accountant()
    arm_dir = matrix.run_dir / f"arm_{name}"
    policy = stage_policy(mini.warm_dir, arm_dir)
    print(f"phase rl ({name}: {kind} loop of {trained_in}): {rl.steps} steps x {rl.tasks_per_step} tasks x "
          f"{rl.samples_per_task} samples", flush=True)
    with mini.cfg.setup.server(policy, arm_dir) as stack:
        with rl_harness(LoopConfig(kind), mini.agent, policy) as agent, \
                tracked(matrix.run_dir, mini.cfg.setup.tracking, f"rl-{name}") as tracker:
            trainer = RLLoop(stack, agent, mini.box, rl, arm_dir, tracker=tracker, accountant=acct,
                                grades=mini.grades, probe_harness=mini.agent)
            history = [s.record for s in trainer.fit(mini.rl_tasks)]
        with acct.phase("eval_after"):
            after = matrix.evaluate_all(stack, arm_dir / "eval", f"rl-{name}")
    return {"trained_in": trained_in, "loop": kind, "dir": arm_dir, "after": after, "history": history,
            "probe": trainer.probe,
            "weights_sha256": weights_sha256(policy), "compute": acct.to_dict(), "wall_s": time.time() - started}


def harness_matrix_job(miniature: MiniatureConfig, matrix: MatrixConfig, rl: RLConfig, run_dir: Path,
                       fidelity: FidelityConfig | None = None, loop: Any = None) -> dict[str, Any]:
    """The warm start evaluated in every harness, one RL arm per training loop, each evaluated in every harness,
    each proxy arm's training rollouts replayed through the rebuilt loop; returns (and writes) the metrics (kind
    ``harness_matrix``) and, with a rebuilt arm, the proxy-vs-rebuilt slice as its own ``loop_comparison`` record
    (``<run>/loop_comparison``). ``loop`` is mini_repro's single-arm setting, inherited by the config and unused:
    ``matrix`` names the arms."""
    run_dir, started, fidelity = Path(run_dir), time.time(), fidelity or FidelityConfig(other_versions=[])
    with prepared_matrix(miniature, matrix, run_dir) as prepared:
        mini = prepared.any
        print(f"phase eval_before: the warm start in {len(prepared.minis)} harnesses x {len(mini.test_list)} tasks",
              flush=True)
        with mini.cfg.setup.server(mini.warm_dir, run_dir) as stack, prepared.acct.phase("eval_before"):
            warm = prepared.evaluate_all(stack, run_dir / "eval_before", mini.warm_label)
        arms = {arm[0]: train_arm(prepared, arm, rl) for arm in matrix.arms}
        print("phase fidelity: each proxy arm's training rollouts replayed through the rebuilt loop", flush=True)
        with prepared.acct.phase("fidelity"):
            fid = matrix_fidelity(prepared, matrix, arms, fidelity)
    metrics = matrix_metrics(prepared, warm, arms, rl, started) | {"fidelity": fid}
    write_metrics(run_dir, metrics)
    loop_slice = proxy_vs_rebuilt(prepared, matrix, warm, arms, fid, rl, started)
    if loop_slice is not None:
        write_slice(run_dir, loop_slice)
    return metrics


def matrix_fidelity(prepared: Matrix, matrix: MatrixConfig, arms: dict[str, dict[str, Any]],
                    cfg: FidelityConfig) -> dict[str, Any]:
    """Per proxy arm: its training rollouts replayed turn by turn through the rebuilt loop of ``rebuilt_of`` (how
    far that loop is from the harness the arm trained in); empty without a rebuilt arm."""
    if not matrix.rebuilt_of:
        return {}
    mini = prepared.minis[matrix.rebuilt_of]
    tasks = {t.instance_id: t for t in [*mini.test_list, *mini.rl_tasks]}
    return {name: replay_store(arm["dir"] / "traces.sqlite", tasks, mini.cfg.setup.harness, mini.warm_dir,
                               mini.box, cfg, mode="train") | {"trained_in": arm["trained_in"]}
            for name, arm in arms.items() if arm["loop"] == "proxy"}


def proxy_vs_rebuilt(prepared: Matrix, matrix: MatrixConfig, warm: dict[str, list[Any]],
                     arms: dict[str, dict[str, Any]], fid: dict[str, Any], rl: RLConfig,
                     started: float) -> dict[str, Any] | None:
    """The proxy arm of ``rebuilt_of`` and the rebuilt arm, both evaluated in that harness, as a
    ``loop_comparison`` record (fidelity keyed by harness version, as that table reads it); None without both."""
    home = matrix.rebuilt_of
    if not home or not matrix.loop_table or home not in arms or REBUILT not in arms:
        return None
    mini = prepared.minis[home]
    pair = {"proxy": home, REBUILT: REBUILT}
    slice_arms = {kind: arms[name] | {"after": arms[name]["after"][home]} for kind, name in pair.items()}
    by_version = {prepared.minis[f["trained_in"]].spec.harness.version: f for f in fid.values()}
    metrics = comparison_metrics(mini, warm[home], slice_arms, by_version, rl, started)
    table = split_table_name(matrix.loop_table, mini.cfg.tasks.split)  # a validation run's slice: its own table
    return metrics | {"experiment": table, "table": table, "slice_of": str(prepared.run_dir)}


def write_slice(run_dir: Path, metrics: dict[str, Any]) -> Path:
    """``<run>/loop_comparison/metrics.json``, with the run's overrides and config beside it (a record of its own
    for ``repro table``)."""
    slice_dir = run_dir / LOOP_SLICE
    slice_dir.mkdir(parents=True, exist_ok=True)
    for name in ("overrides.txt", "config.yaml"):
        if (run_dir / name).is_file():
            shutil.copyfile(run_dir / name, slice_dir / name)
    return write_metrics(slice_dir, metrics)


def matrix_metrics(prepared: Matrix, warm: dict[str, list[Any]], arms: dict[str, dict[str, Any]], rl: RLConfig,
                   started: float) -> dict[str, Any]:
    """The ``harness_matrix`` record: every harness's spec, the warm start's and each arm's evaluations in every
    harness, the paired tests against the warm start, each arm's RL history."""
    mini, ev = prepared.any, prepared.any.cfg.eval
    specs = {name: m.spec for name, m in prepared.minis.items()}

    def evaluated(reports: dict[str, list[Any]], label: str) -> dict[str, Any]:
        return {h: eval_metrics(r, specs[h], ev.experiment, label) for h, r in reports.items()}

    out_arms = {name: {
        "trained_in": a["trained_in"], "loop": a["loop"], "after": evaluated(a["after"], f"rl-{name}"),
        "paired_vs_warm": {h: paired_tests(warm[h], r) for h, r in a["after"].items()},
        "per_instance": {h: per_instance(r) for h, r in a["after"].items()},
        "habits": {h: slip_share(a["dir"] / "traces.sqlite", r, mini.operators) for h, r in a["after"].items()},
        "history": a["history"], "diagnostics": [s["diagnostics"] for s in a["history"]], "probe": a["probe"],
        "weights_sha256": a["weights_sha256"], "compute": a["compute"], "wall_s": a["wall_s"]}
        for name, a in arms.items()}
    return {
        "kind": "harness_matrix", "experiment": ev.experiment, "table": ev.experiment,
        "run_dir": str(prepared.run_dir), "fingerprints": {h: s.fingerprint() for h, s in specs.items()},
        "harnesses": {h: s.harness.name + "@" + s.harness.version for h, s in specs.items()},
        "task_distribution": mini.spec.tasks.name, "train_tasks": mini.train_name, "eval_temperature": ev.temperature,
        "warm_start": mini.warm, "warm": evaluated(warm, mini.warm_label),
        "warm_per_instance": {h: per_instance(r) for h, r in warm.items()}, "arms": out_arms,
        "warm_habits": {h: slip_share(prepared.run_dir / "traces.sqlite", r, mini.operators) for h, r in warm.items()},
        "rl": rl.schedule(), "trainer": asdict(rl.update), "seed": rl.seed, "compute": prepared.acct.to_dict(),
        "started_at": started, "finished_at": time.time(), "wall_s": time.time() - started,
    }

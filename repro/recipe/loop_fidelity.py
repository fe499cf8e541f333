"""How faithful the rebuilt loop is, and the ``loop_comparison`` record: recorded real-harness rollouts (the proxy
arm's, and other harness versions' recorded with the warm-start model) replayed through the rebuilt loop
(:mod:`repro.rl.rebuilt.fidelity`), and the arms' paired comparison. Shared by ``experiment=loop_comparison`` and
``experiment=harness_matrix``."""


from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness_adapters.mini_swe_agent.adapter import MiniSweAgentConfig
from harness_adapters.registry import get_harness
from repro.evaluation import eval_metrics
from repro.evaluation.habits import slip_share
from repro.evaluation.paired import paired_summary
from repro.recipe.miniature import Miniature
from repro.recipe.paired_metrics import paired_tests, per_instance
from repro.recipe.warm_start import prompt_platform
from repro.rl.config import RLConfig
from repro.rl.rebuilt.fidelity import replay_recorded, summarize
from repro.rl.rebuilt.harness import loop_spec
from repro.rl.rollouts import RolloutOptions, RolloutRunner
from repro.sandbox.local import LocalSandbox
from repro.store import open_store


@dataclass
class FidelityConfig:
    """What to replay: up to ``max_rollouts`` recorded proxy-arm rollouts (multi-call ones first), and for each
    of ``other_versions`` of the harness, ``other_tasks`` held-out tasks recorded with the warm-start model."""

    max_rollouts: int = 64
    other_versions: list[str] = field(default_factory=lambda: ["1.17.5"])
    other_mode: str = "text"
    other_tasks: int = 8
    seed: int = 0


def fidelity_replays(run_dir: Path, arms: dict[str, Any], mini: Miniature, cfg: FidelityConfig) -> dict[str, Any]:
    """Replays through the rebuilt loop: the proxy arm's train rollouts, then each other harness version's
    (recorded on the first ``cfg.other_tasks`` held-out tasks)."""
    out: dict[str, Any] = {}
    harness, warm_dir, box = mini.cfg.setup.harness, mini.warm_dir, mini.box
    tasks = {t.instance_id: t for t in [*mini.test_list, *mini.rl_tasks]}
    if "proxy" in arms:
        store_path = arms["proxy"]["dir"] / "traces.sqlite"
        out[harness.version] = replay_store(store_path, tasks, harness, warm_dir, box, cfg, mode="train")
    for version in cfg.other_versions:
        other = MiniSweAgentConfig(**{**asdict(harness), "version": version, "mode": cfg.other_mode})
        try:
            store_path = _record_other(run_dir / f"harness_{version}", other, mini.test_list[:cfg.other_tasks],
                                       mini)
        except Exception as exc:  # an optional comparison: say why it is missing instead of failing the run
            out[version] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        out[version] = replay_store(store_path, tasks, harness, warm_dir, box, cfg, mode="eval")
    return out


def _record_other(phase_dir: Path, cfg: MiniSweAgentConfig, tasks: list[Any], mini: Miniature) -> Path:
    """Rollouts of another harness version with the warm-start model (greedy), recorded in their own store."""
    phase_dir.mkdir(parents=True, exist_ok=True)
    with get_harness("mini-swe-agent", cfg, workers=1) as other, \
            mini.cfg.setup.server(mini.warm_dir, phase_dir) as stack:
        identity = other.identity()
        opts = RolloutOptions(mode="eval", k=1, sampling={"temperature": 0.0}, concurrency=4, write_preds=False,
                              harness_name=identity.get("name", ""), harness_version=identity.get("version", ""))
        runner = RolloutRunner(phase_dir, phase_dir / "traces.sqlite", opts, tasks, stack, other, mini.box, "warm")
        try:
            runner.run(f"mini-swe-agent {cfg.version} rollouts")
        finally:
            runner.close()
    return phase_dir / "traces.sqlite"


def replay_store(store_path: Path, tasks: dict[str, Any], harness: MiniSweAgentConfig, model_dir: Path,
                 box: LocalSandbox, cfg: FidelityConfig, mode: str) -> dict[str, Any]:
    """Up to ``cfg.max_rollouts`` finished ``mode`` rollouts of ``store_path`` replayed through the rebuilt loop of
    ``harness`` (tokenized by ``model_dir``'s tokenizer), summarized."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    spec = loop_spec(harness, model_dir.parent / ".rebuilt-home")
    store = open_store(store_path)
    try:
        picked = _pick(store, tasks, mode, cfg)
        results = replay_recorded(store, picked, tasks, box, spec, tokenizer)
    finally:
        store.close()
    return summarize(results) | {"replayed_from": mode}


def _pick(store: Any, tasks: dict[str, Any], mode: str, cfg: FidelityConfig) -> list[Any]:
    """Finished rollouts of ``mode`` whose task is known; every multi-call one first, then a seeded sample."""
    rollouts = [r for r in store.list_rollouts() if r.mode == mode and r.status == "finished" and r.task_id in tasks]
    calls = {r.rollout_id: store.count_calls([r.rollout_id]) for r in rollouts}
    multi = [r for r in rollouts if calls[r.rollout_id] > 1]
    single = [r for r in rollouts if calls[r.rollout_id] == 1]
    random.Random(cfg.seed).shuffle(single)
    return (multi + single)[:cfg.max_rollouts]


def comparison_metrics(mini: Miniature, before: list[Any], arms: dict[str, Any], fid: dict[str, Any], rl: RLConfig,
                       started: float) -> dict[str, Any]:
    """The ``loop_comparison`` record: the shared start and each arm (``proxy``, ``rebuilt``: its ``after``
    reports, ``dir``, history...) under ``mini``'s frozen spec, paired, with the fidelity replays."""
    ev, spec, warm = mini.cfg.eval, mini.spec, mini.warm
    out_arms = {}
    for kind, arm in arms.items():
        out_arms[kind] = {
            "after": eval_metrics(arm["after"], spec, ev.experiment, f"rl-{kind}"),
            "paired_vs_before": paired_tests(before, arm["after"]),
            "habits_after": slip_share(arm["dir"] / "traces.sqlite", arm["after"], mini.operators),
            "per_instance": per_instance(arm["after"]),
            "history": arm["history"], "diagnostics": [h["diagnostics"] for h in arm["history"]],
            "weights_sha256": arm["weights_sha256"], "compute": arm["compute"], "wall_s": arm["wall_s"],
            "probe": arm["probe"],
        }
    between = _between(arms) if {"proxy", "rebuilt"} <= set(arms) else None
    return {
        "kind": "loop_comparison", "experiment": ev.experiment, "table": ev.experiment, "run_dir": str(mini.run_dir),
        "fingerprint": spec.fingerprint(), "tokenizer": mini.cfg.setup.model.tokenizer,
        "eval_temperature": ev.temperature, "task_distribution": spec.tasks.name,
        "train_tasks": mini.train_name, "before": eval_metrics(before, spec, ev.experiment, mini.warm_label),
        "per_instance_before": per_instance(before),
        "habits_before": slip_share(mini.run_dir / "traces.sqlite", before, mini.operators),
        "weights_sha256_before": warm["weights_sha256"],
        "arms": out_arms, "rebuilt_minus_proxy": between, "fidelity": fid, "warm_start": warm, "seed": rl.seed,
        "platform": prompt_platform(mini.cfg.setup.harness), "rl": rl.schedule(), "trainer": asdict(rl.update),
        "samples": {"mode": rl.samples.mode, "weighting": rl.update.weighting},
        "compute": mini.acct.to_dict(), "started_at": started, "finished_at": time.time(),
        "wall_s": time.time() - started,
    }


def _between(arms: dict[str, Any]) -> dict[str, Any]:
    """Paired difference rebuilt - proxy over instances (per-instance means over the k samples)."""
    return paired_summary(per_instance(arms["proxy"]["after"]), per_instance(arms["rebuilt"]["after"]))

"""``experiment=tokenizer_drift``: how much retokenization drift does a real harness cause on a real tokenizer?

Rollouts of one harness (the ``harness`` group) with the model (``model=tiny_qwen3``: Qwen3's exact tokenizer,
random init) sampled at temperature 1 on bundled tasks, through the recording proxy and the CPU server, as a frozen
evaluation. With ``warm_start.n_demo_tasks > 0`` the model is first fine-tuned (:mod:`repro.recipe.warm_start`)
on the scripted expert's demonstrations through the same harness, on tasks of the train split, so that it makes the
harness's tool calls and its rollouts have turns to measure. Then, from the stored calls
(:mod:`repro.evaluation.retokenization`): the share of turns whose prompt is not the previous prompt + the sampled
completion (per call purpose, with causes), the share of sampled completions that are not the canonical tokenization
of their own text, the prompt lengths (a harness whose prompts do not fit the context reports those instead of
rates) and, for mini-SWE-agent 2.x in tool-call mode, the rebuilt loop's divergence from the harness when the
recordings are replayed through it (:mod:`repro.rl.rebuilt.fidelity`). Writes metrics.json of kind ``tokenizer_drift``;
``repro table`` publishes ``results/<table>.md``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from repro.common.accounting import Accountant
from repro.evaluation import eval_metrics, write_metrics
from repro.evaluation.retokenization import Share, prefix_drift, prompt_lengths, retokenization, total_share
from repro.recipe.setup import Setup, eval_model
from repro.recipe.warm_start import WarmStartConfig, WarmStartRun, warm_start
from repro.report.tokenizer_drift_table import drift_markdown
from repro.rl.evaluator import EvalConfig, Evaluator, build_spec
from repro.rl.rebuilt.fidelity import replay_recorded, summarize
from repro.rl.rebuilt.harness import loop_spec
from repro.serving.engine import end_token_ids
from repro.store import open_store
from repro.tasks.distributions import TaskDistributionConfig
from repro.tasks.sets import TaskFileConfig, load_task_set

KIND = "tokenizer_drift"


@dataclass
class DriftConfig:
    """``replay``: replay the recordings through the rebuilt loop (mini-SWE-agent 2.x tool-call mode only), at most
    ``max_replays`` rollouts (the ones with most calls first)."""

    replay: bool = True
    max_replays: int = 64


def tokenizer_drift_job(setup: Setup, tasks: TaskDistributionConfig | TaskFileConfig, eval: EvalConfig,
                        drift: DriftConfig, run_dir: Path, warm_start: WarmStartConfig | None = None) -> dict[str, Any]:
    """Record the rollouts (after the warm start, when ``warm_start.n_demo_tasks > 0``), then measure the drift;
    returns (and writes) the metrics."""
    logging.getLogger("httpx").setLevel(logging.WARNING)
    run_dir, started = Path(run_dir), time.time()
    name, task_list = load_task_set(tasks)
    store_path = run_dir / "traces.sqlite"
    with setup.harness_and_sandbox() as (agent, box):
        spec = build_spec(agent, name, task_list, setup.sandbox, eval, getattr(tasks, "seed", None),
                          setup.served_model_name)
        model_dir, model_name = eval_model(setup.model, eval, task_list)
        warm = None
        if warm_start is not None and warm_start.n_demo_tasks > 0:
            model_dir, warm = warm_started(WarmStartRun(setup, agent, box, run_dir), model_dir, tasks, warm_start)
            model_name = model_dir.name
        with setup.server(model_dir, run_dir) as stack:
            reports = Evaluator(stack, agent, box, eval, spec=spec, store_path=store_path).evaluate(
                task_list, run_dir, model_name).reports
        print("measuring drift from the stored calls", flush=True)
        replay = {t.instance_id: t for t in task_list} if drift.replay and _replayable(agent.cfg) else None
        measured = measure_store(store_path, model_dir,
                                 setup.serving.max_model_len or setup.model.max_position_embeddings, replay,
                                 agent.cfg, box, drift.max_replays)
    metrics = {
        "kind": KIND, "experiment": eval.experiment, "table": eval.experiment, "run_dir": str(run_dir),
        "harness": f"{spec.harness.name}@{spec.harness.version}", "model": model_name,
        "tokenizer": setup.model.tokenizer, "warm_start": warm, "temperature": eval.temperature,
        "max_tokens": eval.max_tokens,
        "step_limit": spec.limits.step_limit, "task_distribution": name, "fingerprint": spec.fingerprint(),
        "eval": eval_metrics(reports, spec, eval.experiment, model_name), **measured,
        "started_at": started, "finished_at": time.time(), "wall_s": time.time() - started,
    }
    write_metrics(run_dir, metrics)
    print(drift_markdown([metrics]), flush=True)
    return metrics


def warm_started(run: WarmStartRun, base_model: Path, tasks: TaskDistributionConfig | TaskFileConfig,
                 cfg: WarmStartConfig) -> tuple[Path, dict[str, Any]]:
    """The base model fine-tuned on the expert's demonstrations through ``run.agent`` on ``cfg.n_demo_tasks`` tasks
    of the train split of the evaluated distribution (cached like every warm start)."""
    if not isinstance(tasks, TaskDistributionConfig):
        raise SystemExit("tokenizer_drift: a warm start draws its demonstration tasks from the train split of a "
                         "bundled distribution (tasks=bundled); set warm_start.n_demo_tasks=0 for a task file")
    _, demo_tasks = load_task_set(replace(tasks, split="train", n_tasks=cfg.n_demo_tasks))
    accountant = Accountant(nvml=None)
    try:
        warm_dir, warm = warm_start(run, base_model, demo_tasks, cfg, accountant)
    finally:
        accountant.close()
    note = "reused from the cache" if warm["cached"] else f"built from {warm['demo_rollouts']} demonstrations"
    print(f"warm start {warm['key']}: {note}", flush=True)
    return warm_dir, warm


def measure_store(store_path: Path, model_dir: Path, max_model_len: int | None, replay_tasks: dict[str, Any] | None,
                  cfg: Any, box: Any, max_replays: int) -> dict[str, Any]:
    """:func:`measure` on the store's evaluation rollouts, plus :func:`replay_fidelity` of them through the rebuilt
    loop when ``replay_tasks`` (instance id -> task) is given."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    store = open_store(store_path)
    try:
        rollouts = [r for r in store.list_rollouts() if r.mode != "demo"]
        measured = measure([store.calls(r.rollout_id) for r in rollouts], tokenizer, _eos_ids(tokenizer, model_dir),
                           max_model_len)
        if replay_tasks is not None:
            measured["replay"] = replay_fidelity(store, rollouts, replay_tasks, cfg, model_dir, tokenizer, box,
                                                 max_replays)
    finally:
        store.close()
    return measured


def measure(rollouts: list[list[Any]], tokenizer: Any, eos_ids: list[int], max_model_len: int | None) -> dict[str, Any]:
    """Prefix drift, non-canonical completions and prompt lengths over ``rollouts`` (each: its calls in order)."""
    prefix = prefix_drift(rollouts, tokenizer, eos_ids)
    retok = retokenization([c for calls in rollouts for c in calls], tokenizer, eos_ids)
    return {
        "rollouts": len(rollouts), "calls": sum(map(len, rollouts)),
        "calls_ok": sum(1 for calls in rollouts for c in calls if c.completion_ids is not None),
        "prefix_drift": prefix, "prefix_drift_all": total_share(prefix),
        "retokenization": retok, "retokenization_all": total_share(retok, "non_canonical", "completions"),
        "prompt_tokens": prompt_lengths(rollouts, max_model_len),
    }


def _eos_ids(tokenizer: Any, model_dir: Path) -> list[int]:
    """The ids that end a sampled turn, as the CPU server reads them (:func:`repro.serving.engine.end_token_ids`)
    from the checkpoint's generation config (derived from its config when it has none, as transformers does)."""
    from transformers import AutoConfig, GenerationConfig

    try:
        generation = GenerationConfig.from_pretrained(model_dir)
    except OSError:
        generation = GenerationConfig.from_model_config(AutoConfig.from_pretrained(model_dir))
    return sorted(end_token_ids(generation.eos_token_id, tokenizer.eos_token_id))


def _replayable(cfg: Any) -> bool:
    """The rebuilt loop reproduces mini-SWE-agent 2.x's tool-call mode only."""
    return type(cfg).__name__ == "MiniSweAgentConfig" and str(cfg.version).startswith("2.") and \
        cfg.mode == "toolcall"


def replay_fidelity(store: Any, rollouts: list[Any], tasks: dict[str, Any], cfg: Any, model_dir: Path,
                    tokenizer: Any, box: Any, max_replays: int) -> dict[str, Any]:
    """The finished ones of ``rollouts`` (most calls first, at most ``max_replays``) replayed through the rebuilt loop
    (:func:`repro.rl.rebuilt.fidelity.replay_recorded`)."""
    spec = loop_spec(cfg, model_dir.parent / ".rebuilt-home")
    finished = [r for r in rollouts if r.status == "finished" and r.task_id in tasks]
    counts = {r.rollout_id: store.count_calls([r.rollout_id]) for r in finished}
    picked = sorted(finished, key=lambda r: -counts[r.rollout_id])[:max_replays]
    summary = summarize(replay_recorded(store, picked, tasks, box, spec, tokenizer, purpose="policy"))
    return summary | {"share": Share(summary["divergent_turns"], summary["turns"]).to_dict()}

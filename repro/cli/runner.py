"""`repro run`: compose the Hydra config, make a run directory, call the experiment's job.

A run directory holds the resolved config (``config.yaml``), ``manifest.json`` (versions, git SHA,
hardware) and whatever the job writes (``traces.sqlite``, ``metrics.json``, ...); a run that finishes or fails
ends by writing ``record.json``, what its tables need without the run directory (``repro.report.run_records``).
``repro run -m ...`` is a Hydra multirun (``repro.cli.multirun``): one run directory per job of the sweep, through
Hydra's
launcher.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import call, instantiate
from omegaconf import DictConfig, OmegaConf

# compose's names are re-exported: multirun, plan, image builds, scripts and tests import them from here
from repro.common.compose import check_experiment as check_experiment
from repro.common.compose import compose_config, compose_with_hydra
from repro.common.compose import experiment_names as experiment_names
from repro.common.configs import CONFIG_DIR
from repro.common.files import atomic_write_text
from repro.common.pricing import PricingConfig, price_metrics
from repro.common.secrets import REDACTED, is_secret_key, without_secrets
from repro.report.run_records import ERROR_FILE, machine, write_record

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # repro/


def _git(*args: str, cwd: Path) -> str | None:
    """``git args`` in ``cwd``: its stdout, or None when git is missing, fails or hangs."""
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def _git_sha(package_dir: Path = PACKAGE_DIR) -> str | None:
    """The commit of the checkout this code runs from; None for an installed wheel (site-packages is no checkout, or
    sits inside someone else's, e.g. a project's ``.venv``) or without git."""
    top = _git("rev-parse", "--show-toplevel", cwd=package_dir)
    if top is None or Path(top).resolve() / package_dir.name != package_dir:
        return None
    return _git("rev-parse", "HEAD", cwd=package_dir)


def _versions(packages: list[str]) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in packages:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def manifest() -> dict[str, Any]:
    """Provenance of a run: code, packages, interpreter, machine."""
    return {
        "git_sha": _git_sha(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "machine": machine(),
        "packages": _versions(["repro", "torch", "transformers", "tokenizers", "aiohttp", "uvicorn", "hydra-core"]),
        "created_at": time.time(),
    }


def make_run_dir(cfg: DictConfig) -> Path:
    """A new ``<output_root>/<name>/<time>`` directory, or ``run.dir`` when given (to resume a run)."""
    if cfg.run.dir:
        run_dir = Path(cfg.run.dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        return run_dir
    root = Path(cfg.run.output_root)
    run_dir = root / cfg.run.name / time.strftime("%Y%m%d-%H%M%S")
    suffix = 0
    while run_dir.exists():
        suffix += 1
        run_dir = run_dir.with_name(f"{run_dir.name}-{suffix}")
    run_dir.mkdir(parents=True)
    return run_dir


def print_config(overrides: list[str], which: str = "job") -> None:
    """Print the composed config as YAML (``job``: what the run records in ``config.yaml``; ``all``: with the
    ``hydra:`` settings too); nothing runs and nothing is written."""
    from omegaconf import OmegaConf

    cfg = compose_with_hydra(overrides) if which == "all" else compose_config(overrides)
    print(OmegaConf.to_yaml(cfg, resolve=False), end="")


def run(overrides: list[str]) -> Path:
    """Compose, check, record, run; returns the run directory. A config that does not fit its job, or a job that
    rejects its input before writing anything, leaves no run directory behind."""
    cfg = compose_config(overrides)
    check_job_config(cfg)
    run_dir = make_run_dir(cfg)
    try:
        return run_configured(cfg, run_dir, overrides)
    except SystemExit:
        if not cfg.run.dir and {p.name for p in run_dir.iterdir()} <= _RECORD_FILES:
            shutil.rmtree(run_dir, ignore_errors=True)  # rejected before any work: nothing worth keeping
            with contextlib.suppress(OSError):
                run_dir.parent.rmdir()  # the experiment's folder, if this was its only run
        else:
            record_failure(run_dir, overrides, sys.exc_info()[1], outputs=output_root(cfg))
        raise
    except Exception as exc:
        record_failure(run_dir, overrides, exc, outputs=output_root(cfg))
        raise


_RECORD_FILES = {"config.yaml", "overrides.txt", "manifest.json"}


def output_root(cfg: DictConfig) -> Path | None:
    """``run.output_root``, the folder a run's record names its paths under (None when the config has none)."""
    root = (cfg.get("run") or {}).get("output_root")
    return Path(root) if root else None


def record_failure(run_dir: Path, overrides: list[str], exc: BaseException | None, job: int | None = None,
                   outputs: Path | None = None) -> str:
    """Write ``error.json`` (the overrides, the error, a traceback unless it was a clean ``SystemExit``) into a
    run directory whose job failed after it started working, so tables can list the run instead of dropping it
    (``outputs``: the run's output root, which its record names paths under)."""
    clean = isinstance(exc, SystemExit)
    message = str(exc) if clean else f"{type(exc).__name__}: {exc}"
    if clean and isinstance(exc.code, int) and exc.code > 128:  # the SIGTERM/SIGINT handlers exit 128 + signal
        message = f"stopped by {signal.Signals(exc.code - 128).name} (exit {exc.code})"
    record = {"job": job, "overrides": redacted_overrides(overrides), "error": message,
              "traceback": "" if clean else "".join(traceback.format_exception(exc))}
    (run_dir / ERROR_FILE).write_text(json.dumps(record, indent=2))
    with contextlib.suppress(Exception, SystemExit):  # a record is secondary to the error it would hide
        write_record(run_dir, outputs)  # what tables list of the run after its directory is gone
    return message


def check_job_config(cfg: DictConfig) -> None:
    """Build every config object of the job (cheap dataclasses) before anything runs: a key that the target does
    not take, or a value of the wrong type, is one ``error:`` line naming the group instead of a traceback."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise SystemExit(f"error: experiment {cfg.run.name} needs {', '.join(f'{k}=...' for k in missing)} (the "
                         "values marked ??? in its config file say what each one is)")
    fanout = cfg.get("fanout")
    if fanout is not None and fanout.get("kind", "local") != "local" and "fanout" not in cfg.job.get("setup", {}):
        takers = ", ".join(fanout_experiments())
        raise SystemExit(f"error: experiment {cfg.run.name} runs its samples in this process only; fanout="
                         f"{fanout.kind} works with the experiments whose job takes it ({takers})")
    _check_nodes(cfg.job)


def fanout_experiments() -> list[str]:
    """The experiments whose job's setup takes the ``fanout`` group (their config passes ``fanout: ${fanout}``)."""
    configs = CONFIG_DIR / "experiment"
    return sorted(p.stem for p in configs.glob("*.yaml") if "fanout: ${fanout}" in p.read_text(encoding="utf-8"))


def _check_nodes(parent: DictConfig, prefix: str = "") -> None:
    """Instantiate every config node below ``parent``, innermost first, so that an error names the node that does
    not fit (``miniature.tasks``), not the one that contains it."""
    for key, node in parent.items():
        if not isinstance(node, DictConfig):
            continue
        _check_nodes(node, f"{prefix}{key}.")
        if "_target_" in node:
            try:
                instantiate(node, _convert_="all")
            except InstantiationException as exc:
                cause, name = exc.__cause__ or exc, prefix + str(key)
                raise SystemExit(f"error: the {name!r} config does not fit {node._target_}: {cause}") from None


def run_configured(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> Path:
    """Record ``cfg`` and provenance in ``run_dir``, then call the experiment's job there."""
    record_config(cfg, run_dir, overrides)
    (run_dir / "manifest.json").write_text(json.dumps(manifest(), indent=2))
    (run_dir / ERROR_FILE).unlink(missing_ok=True)  # a resumed run: its earlier failure is no longer the outcome
    print(f"run directory: {run_dir}", flush=True)
    try:
        call(cfg.job, run_dir=run_dir)
    except InstantiationException as exc:
        cause = exc.__cause__
        if isinstance(cause, USER_ERRORS):  # a bad input: its message names the fix, a traceback would bury it
            raise SystemExit(f"error: {cause}") from None
        raise
    add_cost(run_dir, cfg.get("pricing"))
    write_record(run_dir, output_root(cfg))  # what is published from this run (repro.report.run_records)
    return run_dir


def add_cost(run_dir: Path, pricing: DictConfig | None) -> None:
    """``metrics["cost"]`` from the run's compute and the configured prices (``repro.common.pricing``); nothing without
    prices or metrics."""
    path = run_dir / "metrics.json"
    if pricing is None or not path.exists():
        return
    metrics = json.loads(path.read_text())
    cost = price_metrics(metrics, PricingConfig(**OmegaConf.to_container(pricing, resolve=True)))
    if cost is not None:
        atomic_write_text(path, json.dumps({**metrics, "cost": cost}, indent=2, sort_keys=True))


def record_config(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> None:
    """Write the resolved ``config.yaml`` and ``overrides.txt``, credentials (e.g. an upstream key) redacted."""
    resolved = without_secrets(OmegaConf.to_container(cfg, resolve=True), replacement=REDACTED)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(resolved)))
    (run_dir / "overrides.txt").write_text("\n".join(redacted_overrides(overrides)) + "\n")


def redacted_overrides(overrides: list[str]) -> list[str]:
    """Command-line overrides with the value of any credential key (``proxy.upstream_api_key=...``) hidden."""
    out = []
    for item in overrides:
        key, sep, _ = item.partition("=")
        name = key.rsplit(".", 1)[-1].lstrip("+~")
        out.append(f"{key}={REDACTED}" if sep and is_secret_key(name) else item)
    return out


def _user_errors() -> tuple[type[BaseException], ...]:
    from harness_adapters.registry import UnknownHarnessError
    from harness_adapters.versions import HarnessVersionError
    from repro.common.venvs import HarnessEnvError
    from repro.sandbox.repos import RepoError
    from repro.serving.vllm_env import VllmEnvError
    from repro.serving.vllm_launcher import VLLMNotInstalledError
    from repro.tasks.loaders import TaskSourceError

    return (TaskSourceError, UnknownHarnessError, HarnessVersionError, HarnessEnvError, RepoError, VllmEnvError,
            VLLMNotInstalledError, SystemExit)


USER_ERRORS = _user_errors()

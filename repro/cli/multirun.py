"""`repro run -m ...`: a Hydra multirun. Each job of the sweep is one ordinary run (``runner.run_configured``)
in its own directory ``<output_root>/<experiment>/<time>/<job number>``, started by Hydra's launcher: the basic
one (in turn, in this process) unless ``hydra/launcher=`` picks another (``joblib_local``: local processes;
``slurm``: submitit on a SLURM cluster). The sweep's own settings (directories, callbacks) are under ``hydra:``
in ``repro/conf/config.yaml`` and the experiment's file."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from repro.cli.runner import check_experiment, output_root, record_failure, run_configured
from repro.common.compose import default_run_name
from repro.common.configs import CONFIG_PATH


def sweep_job(cfg: DictConfig) -> str:
    """One job of the sweep: its run directory is Hydra's output directory for it. A job that fails (a bad
    harness version, a crash) writes ``error.json`` there and the sweep goes on; the sweep's end lists it."""
    hydra_cfg = HydraConfig.get()
    with open_dict(cfg):
        cfg.run.name = cfg.run.name or default_run_name(cfg, hydra_cfg.runtime.choices.get("experiment"))
    run_dir = Path(hydra_cfg.runtime.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    overrides = list(hydra_cfg.overrides.task)
    try:
        return str(run_configured(cfg, run_dir, overrides))
    except (Exception, SystemExit) as exc:  # recorded, then the next job runs (unless the user stopped the sweep)
        message = record_failure(run_dir, overrides, exc, job=hydra_cfg.job.num, outputs=output_root(cfg))
        if stopped_by_signal(exc):
            print(f"sweep stopped at job #{hydra_cfg.job.num}: {message}", file=sys.stderr, flush=True)
            raise
        print(f"sweep job #{hydra_cfg.job.num} failed: {message}", file=sys.stderr, flush=True)
        return f"failed: {message}"


def stopped_by_signal(exc: BaseException) -> bool:
    """True for the exit of the SIGTERM / SIGINT handlers (code 128 + signal): the user stops the whole sweep,
    not one job of it."""
    return isinstance(exc, SystemExit) and isinstance(exc.code, int) and exc.code > 128


def multirun(overrides: list[str]) -> None:
    """Run Hydra's multirun over ``overrides`` (``repro run -m`` has taken the flag off)."""
    check_experiment(overrides)
    main = hydra.main(config_path=CONFIG_PATH, config_name="config", version_base="1.3")(sweep_job)
    saved = sys.argv
    sys.argv = ["repro", "--multirun", *overrides]
    try:
        main()
    finally:
        sys.argv = saved

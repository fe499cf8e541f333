"""Hydra composition of the package's configs: ``overrides`` -> the composed config, as `repro run` records it.

Its own module so that what needs a composed config without running it (`repro plan`, the recipe table in
``repro.report``, image builds) does not import the runner; ``repro.cli.runner`` imports it from here.
"""

from __future__ import annotations

from hydra import compose, initialize_config_module
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict

from repro.common.configs import CONFIG_DIR, CONFIG_MODULE, EXPERIMENT_GROUP, config_groups, split_table_name


def experiment_names() -> list[str]:
    """The experiments (``repro/conf/experiment/*.yaml``), sorted."""
    return config_groups(CONFIG_DIR).get(EXPERIMENT_GROUP, [])


def check_experiment(overrides: list[str]) -> None:
    """SystemExit listing the known experiments when ``experiment=NAME`` names none of them."""
    for item in overrides:
        if item.startswith("experiment=") and item.split("=", 1)[1] not in experiment_names():
            raise SystemExit(f"unknown experiment {item.split('=', 1)[1]!r}; choose one of {experiment_names()} "
                             f"(files in {CONFIG_DIR / 'experiment'})")


def compose_with_hydra(overrides: list[str]) -> DictConfig:
    """The composed config for ``overrides`` with Hydra's own ``hydra:`` settings; an unknown experiment lists the
    known ones, a bad override is one line."""
    check_experiment(overrides)
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        try:
            return compose(config_name="config", overrides=overrides, return_hydra_config=True)
        except HydraException as exc:
            raise SystemExit(f"bad override: {exc}") from None


def compose_config(overrides: list[str]) -> DictConfig:
    """The composed config for ``overrides`` (what a run records), without ``hydra:``."""
    cfg = compose_with_hydra(overrides)
    experiment = cfg.hydra.runtime.choices.get("experiment")
    with open_dict(cfg):
        del cfg["hydra"]
        cfg.run.name = cfg.run.name or default_run_name(cfg, experiment)
    return cfg


def default_run_name(cfg: DictConfig, experiment: str | None) -> str | None:
    """The experiment's name, with ``_validation`` where its held-out tasks are the validation split
    (``tasks.split=validation`` runs as ``mini_repro_validation``: its own folder and table)."""
    if experiment is None:
        return None
    return split_table_name(experiment, OmegaConf.select(cfg, "tasks.split", default=None))

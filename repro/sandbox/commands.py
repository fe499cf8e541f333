"""``repro images build | sweep``: the docker images of an experiment's bundled tasks (built here, no registry),
and removal of containers that killed runs left behind."""

from __future__ import annotations

import argparse
from typing import Any


def add_images_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``images`` (``build``, ``sweep``) on an argparse subparsers object."""
    parser = subparsers.add_parser("images", help="build the docker images of an experiment's bundled tasks "
                                                  "(sandbox=docker), or remove containers left by killed runs")
    sub = parser.add_subparsers(dest="images_command", required=True)
    build = sub.add_parser("build", help="build (or find cached, by content hash) the base image and one image per "
                                         "task of the experiment's task sets (tasks, train_tasks)")
    build.add_argument("overrides", nargs="*", help="as for `repro run`, e.g. experiment=eval_bundled "
                                                    "tasks.n_tasks=100")
    sub.add_parser("sweep", help="remove repro containers whose run is gone (after a kill -9)")
    parser.set_defaults(func=images_command)
    return parser


def experiment_tasks(overrides: list[str]) -> tuple[list[Any], str]:
    """The bundled tasks of an experiment's task sets (``tasks``, and ``train_tasks`` where it has one), and the
    repos dir its sandbox resolves them in."""
    from hydra.utils import instantiate

    from repro.common.compose import compose_config
    from repro.tasks.materialize import REPO_OWNER
    from repro.tasks.sets import TaskFileConfig, load_task_set

    cfg = compose_config(overrides)
    tasks: dict[str, Any] = {}
    for key in ("tasks", "train_tasks"):
        if key in cfg and cfg[key] is not None:
            task_cfg = instantiate(cfg[key], _convert_="all")
            if isinstance(task_cfg, TaskFileConfig) or hasattr(task_cfg, "families"):
                for task in load_task_set(task_cfg)[1]:
                    tasks.setdefault(task.instance_id, task)
    bundled = [t for t in tasks.values() if t.repo.split("/", 1)[0] == REPO_OWNER]
    return bundled, str(cfg.sandbox.get("repos_dir", "repos"))


def images_command(args: argparse.Namespace) -> None:
    from repro.sandbox.docker_engine import client, sweep_orphans

    engine = client()
    if args.images_command == "sweep":
        removed = sweep_orphans(engine)
        print(f"removed {len(removed)} container(s) of runs that are gone" + (f": {', '.join(removed)}" if removed
                                                                               else ""))
        return
    from pathlib import Path

    from repro.sandbox.images import build_task_images
    from repro.sandbox.repos import RepoResolver

    tasks, repos_dir = experiment_tasks(args.overrides)
    summary = build_task_images(engine, tasks, RepoResolver(Path(repos_dir).expanduser()))
    print(f"base image: {summary['base']}")

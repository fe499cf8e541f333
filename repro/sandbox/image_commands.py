"""``repro images build | list``: the docker images of bundled task distributions (built here, no registry)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from repro.tasks.commands import add_distribution_args, config_from_args


def add_images_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``images`` (``build``, ``sweep``) on an argparse subparsers object."""
    parser = subparsers.add_parser("images", help="build the docker images of bundled task distributions "
                                                  "(sandbox=docker), or remove containers left by killed runs")
    sub = parser.add_subparsers(dest="images_command", required=True)
    build = sub.add_parser("build", help="build (or find cached, by content hash) the base image and one image "
                                         "per task; same task options as `repro tasks build`")
    add_distribution_args(build)
    build.add_argument("--repos-dir", default="repos", help="where task repositories resolve (sandbox.repos_dir)")
    sub.add_parser("sweep", help="remove repro containers whose run is gone (after a kill -9)")
    parser.set_defaults(func=images_command)
    return parser


def images_command(args: argparse.Namespace) -> None:
    from repro.sandbox.docker_engine import client, sweep_orphans

    engine = client()
    if args.images_command == "sweep":
        removed = sweep_orphans(engine)
        print(f"removed {len(removed)} container(s) of runs that are gone" + (f": {', '.join(removed)}" if removed
                                                                               else ""))
        return
    from repro.sandbox.images import build_task_images
    from repro.sandbox.repos import RepoResolver
    from repro.tasks.distributions import build_distribution

    tasks = build_distribution(config_from_args(args))
    summary = build_task_images(engine, tasks, RepoResolver(Path(args.repos_dir).expanduser()))
    print(f"base image: {summary['base']}")

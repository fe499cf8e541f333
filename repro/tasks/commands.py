"""``repro tasks build | list | show``: export a bundled distribution to JSONL, count tasks, show one task.

Building the parser imports nothing of the task machinery (the CLI builds every subcommand's parser for any command);
the handlers import it."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from repro.tasks.distributions import TaskDistributionConfig
    from repro.tasks.schema import Task


def add_distribution_args(parser: argparse.ArgumentParser) -> None:
    """Options that select a bundled distribution (see TaskDistributionConfig)."""
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", default=None, help="train | validation | test (default train; for --from: "
                        "the dataset split, if the source has several)")
    parser.add_argument("--n", type=int, default=100, help="number of tasks")
    parser.add_argument("--family", action="append", default=[],
                        help="procedural | packages | package:<name> (repeatable; default procedural)")
    parser.add_argument("--operator", action="append", default=[],
                        help="mutation operator or group (repeatable; default all)")
    parser.add_argument("--difficulty", default="one_step", help="one_step | one_step_brief | multi_step | mixed")
    parser.add_argument("--tasks-per-module", type=int, default=None,
                        help="mutants drawn from one generated module (default: ProceduralConfig's)")


def config_from_args(args: argparse.Namespace) -> TaskDistributionConfig:
    from repro.tasks.distributions import TaskDistributionConfig
    from repro.tasks.procedural import ProceduralConfig

    procedural = ProceduralConfig() if args.tasks_per_module is None else ProceduralConfig(
        tasks_per_module=args.tasks_per_module)
    return TaskDistributionConfig(
        seed=args.seed, split=args.split or "train", n_tasks=args.n, families=args.family or ["procedural"],
        operators=args.operator, difficulty=args.difficulty, procedural=procedural,
    )


def add_tasks_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``tasks`` (with ``build``, ``list``, ``show``) on an argparse subparsers object."""
    parser = subparsers.add_parser("tasks", help="build, count and show task distributions")
    sub = parser.add_subparsers(dest="tasks_command", required=True)
    build = sub.add_parser("build", help="build a bundled distribution (materializes its git repositories) "
                           "and write it as JSONL")
    add_distribution_args(build)
    build.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    listing = sub.add_parser("list", help="count tasks per family / operator / difficulty")
    show = sub.add_parser("show", help="show one task")
    show.add_argument("instance_id")
    show.add_argument("--patch", action="store_true", help="also print the gold patch")
    for p in (listing, show):
        p.add_argument("--from", dest="source", default=None,
                       help="a task file/folder or hub name instead of a bundled distribution")
        add_distribution_args(p)
    parser.set_defaults(func=tasks_command)
    return parser


def _tasks(args: argparse.Namespace) -> list[Task]:
    from repro.tasks.distributions import build_distribution
    from repro.tasks.loaders import load_tasks

    if args.source:
        return load_tasks(args.source, args.split)
    return build_distribution(config_from_args(args))


def counts_table(tasks: list[Task]) -> str:
    """Total, data sha256, and counts per family / operator / difficulty."""
    from repro.tasks.loaders import data_sha256

    lines = [f"tasks: {len(tasks)}", f"data_sha256: {data_sha256(tasks)}"]
    for field in ("family", "operator", "difficulty"):
        counts = Counter(getattr(t, field) or "-" for t in tasks)
        lines.append(f"{field}:")
        lines += [f"  {name:<28} {n:>6}" for name, n in sorted(counts.items())]
    return "\n".join(lines)


def describe(task: Task, patch: bool = False) -> str:
    head = [f"{key}: {getattr(task, key)}" for key in ("instance_id", "repo", "repo_path", "base_commit", "family",
                                                         "operator", "difficulty")]
    head += [f"FAIL_TO_PASS: {task.FAIL_TO_PASS}", f"PASS_TO_PASS: {len(task.PASS_TO_PASS)} tests", "",
             task.problem_statement]
    if patch:
        head += ["gold patch:", task.patch]
    return "\n".join(head)


def tasks_command(args: argparse.Namespace) -> None:
    """Run ``repro tasks <build|list|show>``."""
    if args.tasks_command == "build":
        from repro.tasks.distributions import build_distribution
        from repro.tasks.loaders import write_tasks

        tasks = build_distribution(config_from_args(args))
        write_tasks(tasks, args.out)
        print(f"wrote {len(tasks)} tasks to {args.out}")
        print(counts_table(tasks))
    elif args.tasks_command == "list":
        print(counts_table(_tasks(args)))
    else:
        found = [t for t in _tasks(args) if t.instance_id == args.instance_id]
        if not found:
            raise SystemExit(f"no task {args.instance_id!r} in this source; list them with `repro tasks list` "
                             f"(same options) or check --from")
        print(describe(found[0], args.patch))

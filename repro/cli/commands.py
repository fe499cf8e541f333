"""The `repro` command line: run (Hydra experiments), table, inspect, tasks, images, plan, serve, build-model,
proxy."""

# Building the parser stays light (no model-serving stack, swebench or Hydra: it runs for every command); each
# subcommand imports what it needs in its handler (tests/unit/test_cli_imports.py).

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path


def _run(args: argparse.Namespace) -> None:
    if args.cfg:
        from repro.cli.runner import print_config

        return print_config(args.overrides, args.cfg)
    if args.multirun:
        from repro.cli.multirun import multirun

        return multirun(args.overrides)
    from repro.cli.runner import run

    run(args.overrides)


def _table(args: argparse.Namespace) -> None:
    if args.replot:
        from repro.report.table_plots import replot

        for path in replot(Path(args.results)):
            print(path)
        return
    from repro.report.tables import write_tables

    written = write_tables(Path(args.outputs), Path(args.results))
    if not written:
        raise SystemExit(f"no metrics.json under {args.outputs}; run an experiment first (repro run ...)")
    for path in written:
        print(path)


def _inspect(args: argparse.Namespace) -> None:
    from repro.report.inspect import inspect_path
    from repro.report.run_view import Selection
    from repro.train.samples import SampleConfig

    selection = Selection(tuple(args.phase or ()), tuple(args.outcome or ()), args.limit)
    inspect_path(Path(args.path), args.rollout, SampleConfig(mode=args.samples_mode, weighting=args.weighting),
                 selection)


def _report(args: argparse.Namespace) -> None:
    from repro.report.html_report import build_report

    report = build_report([Path(p) for p in args.run_dirs], Path(args.out), args.max_tasks, args.max_rollouts)
    print(report.index)
    if report.refused:
        raise SystemExit(1)


def _proxy(args: argparse.Namespace) -> None:
    from repro.proxy.server import config_from_args, serve

    serve(config_from_args(args))


class _Parser(argparse.ArgumentParser):
    """An argument parser whose epilog may be a function: called only when the help is printed."""

    def format_help(self) -> str:
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="repro", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    from repro.common.configs import run_help

    run = sub.add_parser("run", help="run an experiment (Hydra overrides, e.g. experiment=bench_proxy); "
                                     "-m/--multirun sweeps comma-separated values (experiment=harness_sweep)",
                         epilog=run_help, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("-m", "--multirun", action="store_true", help="a Hydra multirun: one run per combination")
    run.add_argument("--cfg", choices=("job", "all"), help="print the composed config (job: without Hydra's own "
                     "settings; all: with them) and exit without running")
    run.add_argument("overrides", nargs="*", help="experiment=NAME, GROUP=OPTION and key=value (listed below)")
    run.set_defaults(func=_run)
    table = sub.add_parser("table", help="rebuild results/ tables from runs' metrics.json")
    table.add_argument("--outputs", default="outputs")
    table.add_argument("--results", default="results")
    table.add_argument("--replot", action="store_true", help="only redraw the plots of --results from its CSVs "
                       "(for published tables whose run directories are not on this machine) and link them")
    table.set_defaults(func=_table)
    inspect = sub.add_parser("inspect", help="show the rollouts and calls recorded in a run or trace store")
    inspect.add_argument("path", help="a run directory or a traces.sqlite file")
    inspect.add_argument("rollout", nargs="?", help="a rollout id or instance id: show its turns and verdict")
    inspect.add_argument("--phase", action="append", help="list only rollouts of this phase folder (demos, probe, "
                         "eval_before, rl, rl/step_003, eval_after, an arm such as proxy); repeat or comma-separate")
    inspect.add_argument("--outcome", action="append", help="list only these outcomes: resolved, unresolved, "
                         "infra-failure, not-graded, no-report; repeat or comma-separate")
    inspect.add_argument("--limit", type=int, default=20, help="rows per table (0: all; default 20)")
    from repro.train.samples import MODES, WEIGHTINGS, SampleConfig

    inspect.add_argument("--samples-mode", choices=MODES, default=SampleConfig.mode,
                         help="how a rollout's calls become training rows (shown for one rollout)")
    inspect.add_argument("--weighting", choices=WEIGHTINGS, default=SampleConfig.weighting,
                         help="row weights: a rollout's rows share weight 1, or each row weighs 1")
    inspect.set_defaults(func=_inspect)
    report = sub.add_parser("report", help="write a static HTML report of runs (tables, plots, failed and solved "
                                           "rollouts side by side, calls -> rows); open DIR/index.html")
    report.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (or a sweep directory)")
    report.add_argument("--out", required=True, metavar="DIR", help="the report's folder")
    report.add_argument("--max-tasks", type=int, default=40, help="tasks with a page of their own")
    report.add_argument("--max-rollouts", type=int, default=200, help="rollouts with a page of their own")
    report.set_defaults(func=_report)
    proxy = sub.add_parser("proxy", help="run the recording proxy")
    from repro.proxy.server import add_proxy_arguments

    add_proxy_arguments(proxy)
    proxy.set_defaults(func=_proxy)
    from repro.serving import commands

    commands.add_serve_parser(sub)
    commands.add_build_model_parser(sub)
    from repro.tasks.commands import add_tasks_parser

    add_tasks_parser(sub)
    from repro.sandbox.commands import add_images_parser

    add_images_parser(sub)
    from repro.cli.plan import add_plan_parser

    add_plan_parser(sub)
    return parser


def _exit_on_sigterm() -> None:
    """SIGTERM (kill, a scheduler's time limit) unwinds like Ctrl-C: the servers a job started are stopped."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    _exit_on_sigterm()
    args.func(args)


if __name__ == "__main__":
    main(sys.argv[1:])

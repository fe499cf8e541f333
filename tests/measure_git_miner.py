"""The git miner (``tests/support.py``) over the CPU miniature's default held-out tasks in the local sandbox: how many
working copies it changed and how many it resolved; ``--control N``: the same over the first N tasks in raw clones
of their repositories (every ref). Run: ``PYTHONPATH=. python tests/measure_git_miner.py [--n 400] [--control 50]``."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from repro.sandbox.local import LocalWorkspace
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from tests.support import make_sandbox, mine_git, raw_clone

HELD_OUT = TaskDistributionConfig(seed=0, split="test", n_tasks=400, families=["procedural"], operators=["recipe"],
                                  difficulty="locate")  # experiment=mini_repro's `tasks` (miniature=multi_call)


def measure(n: int, control: int) -> dict[str, object]:
    tasks = build_distribution(TaskDistributionConfig(**{**HELD_OUT.__dict__, "n_tasks": n}))
    counts = {"tasks": len(tasks), "changed": 0, "resolved": 0, "control_tasks": min(control, len(tasks)),
              "control_changed": 0, "control_resolved": 0}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="git-miner-") as tmp:
        sandbox = make_sandbox(Path(tmp) / "repos", Path(tmp) / "ws")
        for i, task in enumerate(tasks):
            workspace = sandbox.workspace(task, f"m{i}")
            mine_git(lambda command, w=workspace: sandbox.run(w, command, 60).output)
            counts["changed"] += workspace.diff() != ""
            counts["resolved"] += sandbox.grade(task, workspace).outcome == "resolved"
            workspace.cleanup()
            if i < control:
                repo, sha = sandbox.resolver.resolve(task)
                clone = Path(tmp) / f"clone-{i}"
                clone.mkdir()
                raw_clone(repo.path, sha, clone)
                raw = LocalWorkspace(clone, sha, Path(tmp) / f"home-{i}")
                mine_git(lambda command, w=raw: sandbox.run(w, command, 60).output)
                counts["control_changed"] += raw.diff() != ""
                counts["control_resolved"] += sandbox.grade(task, raw).outcome == "resolved"
                raw.cleanup()
            if (i + 1) % 50 == 0:
                print(f"{i + 1} tasks: {counts} ({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
        sandbox.close()
    counts["seconds"] = round(time.monotonic() - started, 1)
    return counts


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--control", type=int, default=50)
    args = parser.parse_args()
    print(json.dumps(measure(args.n, args.control)))

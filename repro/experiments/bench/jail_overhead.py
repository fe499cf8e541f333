"""What a rollout's jail costs (:mod:`repro.execution.jail`), measured two ways, interleaved:

- **primitives**: starting ``/bin/true`` in a fresh jail (namespaces, the new root, ``/proc``) against running it
  directly, and one HTTP fetch from inside a jail through its relay against the same fetch from the host;
- **mini-SWE-agent** (the default harness, its local environment): whole rollouts of the real mini-SWE-agent
  2.x pool whose every command runs jailed (``harness.isolation=jail``: one jail per rollout, :meth:`Jail.hold`,
  each command entering it) against the same rollouts unjailed, each rollout ``steps`` commands answered by a
  scripted chat stub (no model: the difference is the jail's).

``repro run experiment=bench_jail`` writes ``metrics.json`` (kind ``jail_overhead``); ``repro table`` publishes
``results/jail_overhead.md``. ``python -m repro.experiments.bench.jail_overhead --n 20`` prints the primitives alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from repro.common.net import free_port, wait_for_http
from repro.execution.jail import Jail, jail_available

FETCH = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10).read()"
# The scripted agent's commands, in turn: a look at a file and a Python check, as a coding agent's steps are.
COMMANDS = ("ls -la && head -5 calc.py", "python -c 'import calc; print(calc.add(2, 3))'")


@dataclass(frozen=True)
class JailBenchConfig:
    """``n``: repeats of each primitive; ``rollouts`` mini-SWE-agent rollouts per mode in ``blocks`` interleaved
    blocks, ``steps`` commands each, ``concurrency`` in flight."""

    n: int = 30
    rollouts: int = 24
    blocks: int = 3
    steps: int = 6
    concurrency: int = 2


def _timed(cmd: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    return time.perf_counter() - started


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median_ms": round(statistics.median(ordered) * 1000, 1),
            "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))] * 1000, 1), "n": len(ordered)}


def _require_jail() -> None:
    why = jail_available()
    if why is not None:
        raise SystemExit(f"no jail on this machine: {why}")


def measure_primitives(n: int) -> dict[str, dict[str, float]]:
    """Median and p90 of each primitive, jailed and direct, over ``n`` interleaved repeats."""
    _require_jail()
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="jail-bench-"))
    (work / "f").write_text("x")
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory",
                               str(work)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/f", 30, server)
        url = f"http://127.0.0.1:{port}/f"
        rows: dict[str, list[float]] = {"true_direct": [], "true_jailed": [], "fetch_direct": [], "fetch_jailed": []}
        env = {"PATH": "/usr/bin:/bin"}
        for _ in range(n):
            with Jail(read_write=[str(work)], proxy_url=f"http://127.0.0.1:{port}") as jail:
                rows["true_jailed"].append(_timed(jail.command(["/bin/true"], work, env)))
                rows["true_direct"].append(_timed(["/bin/true"]))
                rows["fetch_jailed"].append(_timed(jail.command([sys.executable, "-c", FETCH, url], work, env)))
                rows["fetch_direct"].append(_timed([sys.executable, "-c", FETCH, url]))
    finally:
        server.kill()
    return {name: _summary(values) for name, values in rows.items()}


def _scripted(steps: int) -> Any:
    """A stub reply: the ``steps`` commands in turn (by the number of assistant turns so far), then submit."""
    from repro.testing.chat_stub import tool_call_reply

    def reply(rollout_id: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        done = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        command = COMMANDS[done % len(COMMANDS)] if done < steps else "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
        return tool_call_reply(command)(rollout_id, body)

    return reply


def _rollouts(root: Path, url: Any, count: int, timeout_s: float) -> list[Any]:
    from repro.protocols import HarnessRollout
    from repro.tasks.schema import Task

    rollouts = []
    for i in range(count):
        work = root / f"r{i}" / "work"
        work.mkdir(parents=True)
        (work / "calc.py").write_text("def add(a, b):\n    return a + b\n")
        task = Task(instance_id=f"r{i}", repo="o/r", base_commit="0" * 40, problem_statement="Check calc.add.")
        rollouts.append(HarnessRollout(f"r{i}", task, work, url(f"r{i}"), "stub", root / f"r{i}" / "out", timeout_s))
    return rollouts


def measure_mini(cfg: JailBenchConfig, root: Path) -> dict[str, Any]:
    """Seconds per rollout and per command of the real mini-SWE-agent pool, jailed and unjailed, interleaved in
    blocks (each mode keeps one warm pool, so worker start-up is not counted)."""
    from harness_adapters.mini_swe_agent.adapter import MiniSweAgentConfig
    from harness_adapters.mini_swe_agent.pool import MiniSweAgentHarness
    from repro.testing.chat_stub import StubChatServer

    _require_jail()
    modes = ("none", "jail")
    per_block = max(1, cfg.rollouts // cfg.blocks)
    walls: dict[str, list[float]] = {mode: [] for mode in modes}
    statuses: dict[str, list[str]] = {mode: [] for mode in modes}
    pools = {mode: MiniSweAgentHarness(MiniSweAgentConfig(isolation=mode, step_limit=cfg.steps + 2),
                                       state_dir=root / f"state-{mode}") for mode in modes}
    with StubChatServer(_scripted(cfg.steps)) as stub:
        try:
            for pool in pools.values():
                pool.start()
            for block in range(cfg.blocks):
                for mode in modes if block % 2 == 0 else modes[::-1]:
                    batch = _rollouts(root / mode / str(block), stub.url, per_block, 120.0)
                    started = time.perf_counter()
                    results = pools[mode].run(batch, cfg.concurrency)
                    walls[mode].append(time.perf_counter() - started)
                    statuses[mode] += [f"{r.status}:{r.exit_status}" for r in results]
        finally:
            for pool in pools.values():
                pool.close()
    rows = {}
    for mode in modes:
        total, count = sum(walls[mode]), per_block * cfg.blocks
        rows[mode] = {"rollouts": count, "wall_s": round(total, 2),
                      "s_per_rollout": round(total * cfg.concurrency / count, 3),
                      "ms_per_command": round(1000 * total * cfg.concurrency / (count * (cfg.steps + 1)), 1),
                      "submitted": sum(s == "finished:Submitted" for s in statuses[mode])}
    added = rows["jail"]["ms_per_command"] - rows["none"]["ms_per_command"]
    return {"modes": rows, "added_ms_per_command": round(added, 1),
            "added_s_per_rollout": round(rows["jail"]["s_per_rollout"] - rows["none"]["s_per_rollout"], 3)}


def bench_jail_job(bench: JailBenchConfig, run_dir: Path) -> dict[str, Any]:
    """Both measurements; writes ``metrics.json`` (kind ``jail_overhead``) and prints the table."""
    from repro.report.jail_table import jail_overhead_markdown

    run_dir, started = Path(run_dir), time.time()
    primitives = measure_primitives(bench.n)
    mini = measure_mini(bench, run_dir / "mini")
    manifest = json.loads((run_dir / "manifest.json").read_text()) if (run_dir / "manifest.json").exists() else {}
    metrics = {"kind": "jail_overhead", "run_dir": str(run_dir), "config": asdict(bench), "primitives": primitives,
               "mini_swe_agent": mini, "git_sha": manifest.get("git_sha"), "cpu_count": manifest.get("cpu_count"),
               "started_at": started, "finished_at": time.time()}
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    print(jail_overhead_markdown([metrics]), flush=True)
    return metrics


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m repro.experiments.bench.jail_overhead",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=30)
    print(json.dumps(measure_primitives(parser.parse_args(argv).n), indent=2))


if __name__ == "__main__":
    main()

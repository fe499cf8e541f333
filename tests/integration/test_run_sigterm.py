"""`repro run` stopped with SIGTERM (kill, a SLURM time limit) unwinds: the model server, proxy and harness
workers it started do not outlive it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_sigterm_stops_every_process_the_run_started(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "repro.cli.commands", "run", "experiment=eval_bundled", "tasks.n_tasks=40", "eval.k=2",
           f"run.output_root={tmp_path}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        children = _wait_for_servers(proc, timeout_s=240)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, [p.cmdline()[:4] for p in alive]
    finally:
        if proc.poll() is None:
            proc.kill()


def _wait_for_servers(proc: subprocess.Popen, timeout_s: float) -> list[psutil.Process]:
    """The run's child processes once its model server and proxy are both up."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        children = psutil.Process(proc.pid).children(recursive=True)
        lines = [_cmdline(c) for c in children]
        if any("repro.serving.cpu_server" in x for x in lines) and any("repro.proxy" in x for x in lines):
            time.sleep(2)  # let the job get going (harness workers, rollouts)
            return psutil.Process(proc.pid).children(recursive=True)
        time.sleep(0.5)
    raise AssertionError("the run never started its model server and proxy")


def _cmdline(process: psutil.Process) -> str:
    """The process's command line; "" for one that exited (or became a zombie) since it was listed."""
    try:
        return " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return ""

"""Process helpers shared by the harness adapters: run in a session, wait without reaping, kill whole trees,
read log tails; a clean, isolated environment for a harness process; one thread per rollout for the adapters
that start one process per rollout."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from repro.common.waiting import readable
from repro.protocols import HarnessResult, HarnessRollout

TAIL_CHARS = 4000
DUPLICATE_IDS = "rollout ids must be unique within a run"
DUMMY_API_KEY = "sk-repro-dummy"  # harnesses get this, never a real key
PASSTHROUGH_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")


@dataclass(frozen=True)
class ProcessOutcome:
    """How a process run by :func:`run_in_session` ended (``exit_code`` is None after a timeout)."""

    exit_code: int | None
    timed_out: bool
    duration_s: float
    cpu_s: float


def run_in_session(cmd: list[str], cwd: Path, env: dict[str, str], output_dir: Path, timeout_s: float, *,
                   stdin: Path | None = None, jail: Any = None) -> ProcessOutcome:
    """Run ``cmd`` in its own session, output to ``output_dir/{stdout,stderr}.log``, stdin from ``stdin``
    (default /dev/null); on timeout kill its group and every descendant's group. In ``jail``
    (:class:`repro.execution.jail.Jail`) ``cmd`` runs inside it, with ``env`` and ``cwd`` there."""
    started = time.monotonic()
    if jail is not None:
        cmd, env = jail.command(cmd, cwd, env), {"PATH": os.environ.get("PATH", os.defpath)}
    with open(output_dir / "stdout.log", "wb") as out, open(output_dir / "stderr.log", "wb") as err, \
            (open(stdin, "rb") if stdin else contextlib.nullcontext(subprocess.DEVNULL)) as inp:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=inp, stdout=out, stderr=err, start_new_session=True)
    timed_out = not wait_for_exit(proc.pid, timeout_s)
    if timed_out:
        kill_tree(proc.pid)
    _, status, rusage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    kill_group(proc.pid)  # stragglers left in the process's own group
    return ProcessOutcome(
        exit_code=None if timed_out else proc.returncode,
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
        cpu_s=rusage.ru_utime + rusage.ru_stime,
    )


def wait_for_exit(pid: int, timeout_s: float) -> bool:
    """Block until ``pid`` exits (True) or ``timeout_s`` passes (False), without reaping it."""
    fd = os.pidfd_open(pid)
    try:
        return readable(fd, timeout_s)
    finally:
        os.close(fd)


def kill_tree(pid: int) -> None:
    """SIGKILL the process group of ``pid`` and those of all its descendants (agent commands own one)."""
    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    groups = {pid}
    for child in descendants:
        try:
            groups.add(os.getpgid(child.pid))
        except ProcessLookupError:
            continue
    for group in groups:
        kill_group(group)


def kill_group(pgid: int) -> None:
    """SIGKILL a process group; a group that is already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def tail(path: Path, n_chars: int = TAIL_CHARS) -> str:
    """The last ``n_chars`` of a text file ('' when it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - n_chars))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def last_line(text: str) -> str:
    """The last non-blank line of ``text`` ('' when none)."""
    lines = text.strip().splitlines()
    return lines[-1].strip() if lines else ""


def kill_processes_under(directories: list[Path]) -> int:
    """SIGKILL the process group of every process whose cwd is inside one of ``directories``; return how many.

    For agent commands orphaned by a dead harness worker: they run in their own sessions, so killing the
    worker's tree no longer reaches them. This process's own group is never killed.
    """
    roots = [os.path.realpath(d) for d in directories]
    own_group, killed = os.getpgrp(), 0
    for proc in psutil.process_iter(["pid", "cwd"]):
        cwd = proc.info.get("cwd")
        if not cwd or not any(cwd == root or cwd.startswith(root.rstrip("/") + "/") for root in roots):
            continue
        try:
            group = os.getpgid(proc.pid)
        except ProcessLookupError:
            continue
        if group != own_group and proc.pid != os.getpid():
            kill_group(group)
            killed += 1
    return killed


def isolated_env(home: Path, *, extra_dirs: Sequence[str] = ()) -> dict[str, str]:
    """A clean environment for a LiteLLM-based harness: a few locale/PATH variables from the parent, nothing else
    (no secrets), an isolated HOME with its XDG dirs (made here, with ``extra_dirs`` under it), the dummy key,
    LiteLLM's local cost map (else it fetches one), plain unbuffered output."""
    for sub in ("", ".config", ".cache", ".local/share", *extra_dirs):
        (home / sub).mkdir(parents=True, exist_ok=True)
    env = {key: os.environ[key] for key in PASSTHROUGH_ENV if key in os.environ}
    env.setdefault("PATH", os.defpath)
    return env | {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local/share"),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "OPENAI_API_KEY": DUMMY_API_KEY,
        "NO_COLOR": "1",
        "PYTHONUNBUFFERED": "1",
    }


def check_concurrency(concurrency: int) -> None:
    """ValueError unless ``concurrency`` >= 1."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")


def check_batch(rollouts: Sequence[HarnessRollout], concurrency: int) -> None:
    """ValueError unless ``concurrency`` >= 1 and the rollout ids are unique."""
    check_concurrency(concurrency)
    ids = [r.rollout_id for r in rollouts]
    if len(set(ids)) != len(ids):
        raise ValueError(DUPLICATE_IDS)


def unique_rollouts(rollouts: Iterable[HarnessRollout]) -> Iterator[HarnessRollout]:
    """``rollouts`` as they come (lazily), with a ValueError at the first id seen before."""
    seen: set[str] = set()
    for rollout in rollouts:
        if rollout.rollout_id in seen:
            raise ValueError(DUPLICATE_IDS)
        seen.add(rollout.rollout_id)
        yield rollout


def run_in_threads(rollouts: list[HarnessRollout], concurrency: int,
                   run_one: Callable[[HarnessRollout], HarnessResult], name: str) -> list[HarnessResult]:
    """``run_one`` for each rollout, at most ``concurrency`` at once; results in order. If anything escapes (an
    interrupt), the rest is cancelled and every process left in the rollouts' workdirs is killed."""
    check_batch(rollouts, concurrency)
    results: dict[str, HarnessResult] = {}
    stream_in_threads(rollouts, concurrency, run_one, lambda r, result: results.__setitem__(r.rollout_id, result),
                      name)
    return [results[r.rollout_id] for r in rollouts]


def stream_in_threads(rollouts: Iterable[HarnessRollout], concurrency: int,
                      run_one: Callable[[HarnessRollout], HarnessResult],
                      on_result: Callable[[HarnessRollout, HarnessResult], None], name: str) -> int:
    """The streaming form of :func:`run_in_threads`: the next rollout is taken from ``rollouts`` (lazily: an
    iterator may prepare it then) only when fewer than ``concurrency`` run, and ``on_result`` gets each result on
    the calling thread as soon as it ends (in the order they end). Returns how many ran; ids must be unique."""
    check_concurrency(concurrency)
    source, count = unique_rollouts(rollouts), 0
    ended: queue.Queue[Future[HarnessResult]] = queue.Queue()
    running: dict[Future[HarnessResult], HarnessRollout] = {}
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix=name)
    exhausted = False
    try:
        while True:
            while not exhausted and len(running) < concurrency:
                rollout = next(source, None)
                if rollout is None:
                    exhausted = True
                    break
                future = pool.submit(run_one, rollout)
                running[future] = rollout
                future.add_done_callback(ended.put)
            if not running:
                return count
            future = ended.get()
            on_result(running.pop(future), future.result())
            count += 1
    except BaseException:
        for future in running:
            future.cancel()
        kill_processes_under([Path(r.workdir) for r in running.values()])  # the running harnesses and their commands
        raise
    finally:
        pool.shutdown(wait=True)

"""Rollouts fanned out over sandbox hosts with Ray (``fanout=ray``): one actor per host, each with its own harness
(its workers) and sandbox, running whole samples: workspace -> harness -> patch -> grade -> cleanup.

The driver keeps what must stay in one place: registering each rollout with the proxy, the trace store, the
reports and the rewards (:class:`repro.rl.rollouts.RolloutRunner`). An actor gets a :class:`SampleJob` (the task, the
rollout id and the proxy URL it must call) and returns a :class:`SampleOutcome` (the harness's ending, the patch,
the verdict). ``ray.init()`` is local by default (tests, one machine); ``fanout.address`` names a cluster
(``auto``, ``ray://HOST:10001``), and then the proxy must be reachable from the hosts: bind it with
``proxy.host=0.0.0.0`` and give the address they reach it at as ``fanout.advertise_host`` (the proxy has no
authentication: only on a private network). Ray is the ``ray`` extra, imported only when selected.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.protocols import (
    GradeResult,
    HarnessLimits,
    HarnessResult,
    HarnessRollout,
    command_env,
    require_container_support,
)
from repro.sandbox.docker_engine import ImageMissing
from repro.sandbox.repos import RepoError
from repro.tasks.schema import Task

RAY_HINT = "fanout=ray needs Ray: pip install -e '.[ray]' (or leave fanout=local)"
FANOUT_KINDS = ("local", "ray")


@dataclass
class FanoutConfig:
    """Where samples run: ``local`` (this process's harness and sandbox) or ``ray`` (``hosts`` actors)."""

    kind: str = "local"
    address: str | None = None  # None: a local Ray; "auto" / "ray://HOST:10001": an existing cluster
    hosts: int = 2  # actors, one per sandbox host
    cpus_per_host: float = 1.0  # Ray CPUs each actor reserves (its harness workers, sandbox and grading)
    harness_workers: int = 1  # long-lived harness processes per host (mini-SWE-agent 2.x)
    advertise_host: str | None = None  # the proxy's address as the hosts reach it (a cluster); None: 127.0.0.1

    def __post_init__(self) -> None:
        if self.kind not in FANOUT_KINDS:
            raise ValueError(f"fanout.kind must be one of {FANOUT_KINDS}, got {self.kind!r}")
        if self.hosts < 1:
            raise ValueError(f"fanout.hosts must be >= 1, got {self.hosts}")


@dataclass
class SampleJob:
    """One sample for a host: what to solve, where the model is (the proxy's per-rollout base URL)."""

    task: Task
    sample: int
    rollout_id: str
    base_url: str
    model_name: str
    output_dir: Path
    timeout_s: float
    grade: bool = True


@dataclass
class SampleOutcome:
    """What a host sends back: the harness's ending, the patch and the verdict, and which host ran it."""

    result: HarnessResult
    grade: GradeResult
    patch: str
    host: str


def host_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _prepare(box: Any, job: SampleJob) -> tuple[Any, HarnessRollout] | SampleOutcome:
    try:
        workspace = box.workspace(job.task, job.rollout_id)
    except (RepoError, ImageMissing) as exc:
        reason = str(exc)
        return SampleOutcome(HarnessResult(job.rollout_id, "crashed", reason=f"workspace could not be made: {reason}"),
                             GradeResult("error", reason), "", host_name())
    rollout = HarnessRollout(job.rollout_id, job.task, workspace.path, job.base_url, job.model_name, job.output_dir,
                             job.timeout_s, container=getattr(workspace, "container_spec", None),
                             env=command_env(workspace))
    return workspace, rollout


def finish_sample(workspace: Any, result: HarnessResult,
                  grade: Callable[[str], GradeResult]) -> tuple[GradeResult, str]:
    """(verdict, patch) of a finished rollout: its patch read (from its container when it ran in one), graded by
    ``grade``, the workspace removed. A patch that cannot be read is an ``error`` verdict."""
    if hasattr(workspace, "adopt"):  # a container the harness ran: its patch came back with the result
        workspace.adopt(result)
    try:
        patch = workspace.diff()
    except OSError as exc:
        workspace.cleanup()
        return GradeResult("error", str(exc)), ""
    verdict = grade(patch)
    workspace.cleanup()
    return verdict, patch


def _finish(box: Any, job: SampleJob, workspace: Any, result: HarnessResult) -> SampleOutcome:
    def grade(_: str) -> GradeResult:
        return box.grade(job.task, workspace) if job.grade else GradeResult("unresolved", "not graded (demonstration)")

    verdict, patch = finish_sample(workspace, result, grade)
    return SampleOutcome(result, verdict, patch, host_name())


def execute_samples(harness: Any, box: Any, jobs: list[SampleJob], concurrency: int,
                    grading_threads: int = 2) -> list[SampleOutcome]:
    """Run ``jobs`` on this host, in order: workspaces, the harness on all of them, then grading."""
    outcomes: list[SampleOutcome | None] = [None] * len(jobs)
    live: list[tuple[int, Any, HarnessRollout]] = []
    for index, job in enumerate(jobs):
        prepared = _prepare(box, job)
        if isinstance(prepared, SampleOutcome):
            outcomes[index] = prepared
        else:
            live.append((index, *prepared))
    results = harness.run([rollout for _, _, rollout in live], concurrency) if live else []

    def finish(item: tuple[tuple[int, Any, HarnessRollout], HarnessResult]) -> tuple[int, SampleOutcome]:
        (index, workspace, _), result = item
        return index, _finish(box, jobs[index], workspace, result)

    with ThreadPoolExecutor(max(1, grading_threads), thread_name_prefix="grading") as pool:
        for index, outcome in pool.map(finish, zip(live, results, strict=True)):
            outcomes[index] = outcome
    return [o for o in outcomes if o is not None]


def _host_class() -> Any:
    """The Ray actor class (built on first use, so that importing this module never imports Ray)."""
    import ray

    @ray.remote
    class SampleHost:
        def __init__(self, harness_name: str | None, harness_cfg: Any, sandbox_cfg: Any, workers: int) -> None:
            from harness_adapters.registry import get_harness
            from repro.sandbox.select import make_sandbox

            self.harness = get_harness(harness_name, harness_cfg, workers=workers).__enter__()
            self.box = make_sandbox(sandbox_cfg)
            require_container_support(self.harness, self.box, harness_name or "")

        def identity(self) -> dict[str, Any]:
            return self.harness.identity()

        def run(self, jobs: list[SampleJob], concurrency: int) -> list[SampleOutcome]:
            return execute_samples(self.harness, self.box, jobs, concurrency)

        def close(self) -> None:
            self.box.close()
            self.harness.__exit__(None, None, None)

    return SampleHost


class RayFanout:
    """A harness-like object whose samples run on Ray actors (``RolloutRunner`` calls :meth:`run_samples`)."""

    loop_kind = "proxy"
    acts_in_containers = True  # each host checks its own harness against its own sandbox

    def __init__(self, harness_name: str | None, harness_cfg: Any, sandbox_cfg: Any, cfg: FanoutConfig) -> None:
        try:
            import ray
        except ImportError as exc:
            raise ImportError(RAY_HINT) from exc
        self.cfg, self.fanout = harness_cfg, cfg
        self._started_ray = not ray.is_initialized()
        if self._started_ray:
            local = cfg.address is None
            ray.init(address=cfg.address, include_dashboard=False, log_to_driver=False,
                     **({"num_cpus": max(os.cpu_count() or 1, int(cfg.hosts * cfg.cpus_per_host + 0.999))}
                        if local else {}))
        host = _host_class()
        self.hosts = [host.options(num_cpus=cfg.cpus_per_host).remote(harness_name, harness_cfg, sandbox_cfg,
                                                                          cfg.harness_workers)
                      for _ in range(cfg.hosts)]
        self._identity = ray.get(self.hosts[0].identity.remote())

    def identity(self) -> dict[str, Any]:
        return self._identity

    @property
    def name(self) -> str:
        return str(self._identity.get("name", ""))

    @property
    def version(self) -> str:
        return str(self._identity.get("version", ""))

    @property
    def limits(self) -> HarnessLimits:
        """The limits of the hosts' harness config."""
        return HarnessLimits.of(self.cfg)

    def base_url(self, client: Any, rollout_id: str) -> str:
        """The rollout's base URL (its capability: :class:`repro.proxy.client.ProxyClient`) as the hosts reach the
        proxy."""
        proxy_url = client.url
        if self.fanout.advertise_host:
            proxy_url = proxy_url.replace("127.0.0.1", self.fanout.advertise_host, 1)
        return client.base_url(rollout_id, proxy_url)

    def run_samples(self, jobs: list[SampleJob], concurrency: int) -> list[SampleOutcome]:
        """``jobs`` dealt round-robin over the hosts (each runs its share at ``concurrency / hosts``); in order."""
        import ray

        n = len(self.hosts)
        shares = [jobs[i::n] for i in range(n)]
        per_host = max(1, -(-concurrency // n))
        futures = [(i, host.run.remote(share, per_host)) for i, (host, share) in enumerate(zip(self.hosts, shares,
                                                                                                 strict=True)) if share]
        by_host = {i: ray.get(future) for i, future in futures}
        ordered: list[SampleOutcome] = []
        for k in range(len(jobs)):
            ordered.append(by_host[k % n][k // n])
        return ordered

    def close(self) -> None:
        import ray

        try:
            ray.get([host.close.remote() for host in self.hosts])
        finally:
            for host in self.hosts:
                ray.kill(host)
            if self._started_ray:
                ray.shutdown()

    def __enter__(self) -> RayFanout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def harness_for(name: str | None, harness_cfg: Any, sandbox_cfg: Any, fanout: FanoutConfig | None,
                workers: int = 1) -> Iterator[Any]:
    """The job's harness: this process's (``fanout=local``) or the Ray hosts' (``fanout=ray``)."""
    if fanout is None or fanout.kind == "local":
        from harness_adapters.registry import get_harness

        with get_harness(name, harness_cfg, workers=workers) as agent:
            yield agent
        return
    with RayFanout(name, harness_cfg, sandbox_cfg, fanout) as agent:
        yield agent

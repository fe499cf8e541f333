"""The Docker engine, as the docker sandbox uses it: a client (docker SDK, imported only when selected), the
labels every container of a run carries, resource limits, commands with a wall-clock bound, and clean-up.

Every container repro starts (or asks a harness to start) is labelled ``repro.run=<run id>``,
``repro.host=<hostname>`` and ``repro.pid=<pid of the run's process>``. A run removes its containers on every
exit path it sees (normal end, exception, Ctrl-C, SIGTERM); after a SIGKILL it sees none, so the next start
calls :func:`sweep_orphans`, which removes the containers of this host whose owning process is gone.
"""

from __future__ import annotations

import io
import os
import shlex
import socket
import tarfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

LABEL_RUN = "repro.run"
LABEL_HOST = "repro.host"
LABEL_PID = "repro.pid"
LABEL_ROLE = "repro.role"  # "rollout" (a harness acts in it) or "grade" (a patch is graded in it)
LABEL_ROLLOUT = "repro.rollout"
KILL_GRACE_S = 5

ENGINE_HELP = ("a Docker engine must be running and reachable (DOCKER_HOST or /var/run/docker.sock): on Debian, "
               "`apt-get install docker.io` then start `dockerd` as root; the Python SDK comes with "
               "`pip install 'repro[docker]'`")


class DockerUnavailable(RuntimeError):
    """No usable Docker engine (SDK missing, daemon not running or not reachable)."""


class ImageMissing(RuntimeError):
    """A task's image is not on this engine."""


def client() -> Any:
    """A connected ``docker.DockerClient``; :class:`DockerUnavailable` (with how to fix it) otherwise."""
    try:
        import docker
    except ImportError as exc:
        raise DockerUnavailable(f"the docker SDK is not installed ({exc}); {ENGINE_HELP}") from exc
    try:
        engine = docker.from_env(timeout=120)
        engine.ping()
    except Exception as exc:  # docker.errors.DockerException, requests' connection errors
        raise DockerUnavailable(f"cannot reach the Docker engine ({type(exc).__name__}: {exc}); {ENGINE_HELP}"
                                ) from exc
    return engine


def engine_available() -> str | None:
    """None when an engine answers, else the reason why not (one line, for test skips)."""
    try:
        client().close()
    except DockerUnavailable as exc:
        return str(exc).split(";")[0]
    return None


@dataclass
class ContainerLimits:
    """Per-container resource limits (0 = none) and network (``none`` by default: model calls go host -> proxy)."""

    cpus: float = 1.0
    memory_mb: int = 2048
    pids: int = 256
    network: str = "none"

    def run_args(self) -> list[str]:
        """The limits as ``docker run`` options (for harnesses that start their own containers)."""
        args = ["--network", self.network]
        if self.cpus:
            args += ["--cpus", f"{self.cpus:g}"]
        if self.memory_mb:
            args += ["--memory", f"{self.memory_mb}m", "--memory-swap", f"{self.memory_mb}m"]
        if self.pids:
            args += ["--pids-limit", str(self.pids)]
        return args

    def sdk_kwargs(self) -> dict[str, Any]:
        """The limits as ``containers.create`` keyword arguments."""
        kwargs: dict[str, Any] = {"network_mode": self.network}
        if self.cpus:
            kwargs["nano_cpus"] = int(self.cpus * 1e9)
        if self.memory_mb:
            kwargs["mem_limit"] = kwargs["memswap_limit"] = f"{self.memory_mb}m"
        if self.pids:
            kwargs["pids_limit"] = self.pids
        return kwargs


def run_labels(run_id: str, role: str) -> dict[str, str]:
    """The labels of a container this process owns."""
    return {LABEL_RUN: run_id, LABEL_HOST: socket.gethostname(), LABEL_PID: str(os.getpid()), LABEL_ROLE: role}


def label_args(labels: dict[str, str]) -> list[str]:
    """Labels as ``docker run`` options."""
    return [arg for key, value in labels.items() for arg in ("--label", f"{key}={value}")]


def image_id(engine: Any, image: str) -> str:
    """The image's content id (``sha256:...``, what the frozen spec records instead of a tag)."""
    import docker.errors

    try:
        return str(engine.images.get(image).id)
    except docker.errors.ImageNotFound as exc:
        raise ImageMissing(f"image {image!r} is not on this Docker engine: build the bundled ones with "
                           f"`repro images build`; SWE-bench's with `docker pull {image}` or swebench's own build "
                           "(python -m swebench.harness.prepare_images --instance_ids ...)") from exc


@dataclass
class ExecResult:
    """One command in a container: exit code (124 or 137 when the bound killed it), merged output."""

    exit_code: int
    output: str
    timed_out: bool
    duration_s: float


def bounded(command: str, timeout_s: float) -> list[str]:
    """``command`` under coreutils' ``timeout`` inside the container (the process there dies at the bound, not
    only the host's ``docker exec`` client)."""
    return ["timeout", "--kill-after", str(KILL_GRACE_S), f"{timeout_s:g}", "bash", "-c", command]


def exec_bounded(container: Any, command: str, timeout_s: float, workdir: str = "/testbed",
                 environment: dict[str, str] | None = None) -> ExecResult:
    """Run ``bash -c command`` in a running container, killed at ``timeout_s`` (exit 124/137 = timed out)."""
    started = time.monotonic()
    code, output = container.exec_run(bounded(command, timeout_s), workdir=workdir, environment=environment or {},
                                      demux=False)
    text = (output or b"").decode("utf-8", errors="replace")
    return ExecResult(int(code), text, int(code) in (124, 137), time.monotonic() - started)


def put_file(container: Any, path: str, data: bytes, mode: int = 0o644) -> None:
    """Write one file into a container (its folder must exist)."""
    folder, name = path.rsplit("/", 1)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), mode, int(time.time())
        tar.addfile(info, io.BytesIO(data))
    container.put_archive(folder or "/", buffer.getvalue())


def remove_quietly(containers: Iterable[Any]) -> int:
    """Force-remove containers, ignoring ones already gone; how many were removed."""
    import docker.errors

    removed = 0
    for container in containers:
        try:
            container.remove(force=True)
            removed += 1
        except docker.errors.NotFound:
            continue
        except docker.errors.APIError as exc:
            if getattr(exc, "status_code", None) not in (404, 409):  # 409: removal already in progress
                raise
    return removed


def labelled(engine: Any, label: str) -> list[Any]:
    """The containers (running or not) that carry ``label`` (``key`` or ``key=value``); one removed while the list is
    read is left out (docker-py would otherwise raise NotFound inspecting it: another run's cleanup, a sweep)."""
    return engine.containers.list(all=True, ignore_removed=True, filters={"label": label})


def remove_run_containers(engine: Any, run_id: str) -> int:
    """Remove every container labelled with ``run_id`` (running or not)."""
    return remove_quietly(labelled(engine, f"{LABEL_RUN}={run_id}"))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_orphans(engine: Any) -> list[str]:
    """Remove repro containers of this host whose owning process is gone (a run killed with SIGKILL, a crashed
    worker); the names of those removed."""
    host = socket.gethostname()
    orphans = []
    for container in labelled(engine, f"{LABEL_HOST}={host}"):
        pid = container.labels.get(LABEL_PID, "")
        if not pid.isdigit() or not _pid_alive(int(pid)):
            orphans.append(container)
    remove_quietly(orphans)
    return [c.name for c in orphans]


def describe_command(argv: list[str]) -> str:
    """A command line for logs."""
    return shlex.join(argv)

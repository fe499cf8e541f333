"""The sandbox a job uses, chosen by its config (``sandbox=local`` or ``sandbox=docker``), and what the frozen
spec records about it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from typing import Any

from repro.execution.limits import ResourceLimits
from repro.sandbox.config import LocalSandboxConfig, SandboxSpec
from repro.sandbox.grading_env import grading_identity, grading_python
from repro.sandbox.local import LocalSandbox
from repro.tasks.schema import Task


def make_sandbox(config: Any) -> Any:
    """A ``LocalSandbox`` or a ``DockerSandbox`` (the docker SDK is imported only then); a docker sandbox first
    removes the containers that killed runs of this host left behind."""
    if isinstance(config, LocalSandboxConfig):
        return LocalSandbox(config)
    from repro.sandbox.docker import DockerSandbox, DockerSandboxConfig
    from repro.sandbox.docker_engine import client, sweep_orphans

    if not isinstance(config, DockerSandboxConfig):
        raise TypeError(f"unknown sandbox config {type(config).__name__}: sandbox=local | docker")
    engine = client()
    removed = sweep_orphans(engine)
    if removed:
        print(f"sandbox: removed {len(removed)} container(s) left by runs that are gone", flush=True)
    return DockerSandbox(config, engine)


def sandbox_spec(config: Any, tasks: list[Task]) -> SandboxSpec:
    """The frozen spec's sandbox: limits, the grading interpreter; for docker, every task image's content id."""
    if isinstance(config, LocalSandboxConfig):
        return SandboxSpec.of("local", config.test_timeout_s, config.limits,
                              {"grading": grading_identity(grading_python(config.python))})
    from repro.sandbox.docker import DockerSandbox

    box = DockerSandbox(config)
    images = {t.instance_id: _content_id(box, t) for t in tasks}
    missing = sorted(i for i, content in images.items() if content is None)
    if missing:  # their rollouts end as infrastructure failures naming the image; the spec says so
        print(f"sandbox: {len(missing)} task image(s) missing, e.g. for {missing[0]}: build or pull them first",
              flush=True)
    digest = hashlib.sha256(json.dumps(sorted(images.items())).encode()).hexdigest()
    settings = {"images": len(images), "images_missing": len(missing), "images_sha256": digest,
                "limits": asdict(config.limits), "command_timeout_s": config.command_timeout_s,
                "scrub_history": config.scrub_history}
    limits = ResourceLimits(cpu_s=0, memory_mb=config.limits.memory_mb, file_size_mb=0)  # the container's memory only
    return SandboxSpec.of("docker", config.test_timeout_s, limits, settings)


def _content_id(box: Any, task: Task) -> str | None:
    from repro.sandbox.docker_engine import ImageMissing, image_id

    try:
        return image_id(box.engine, box.image(task).name)
    except ImageMissing:
        return None

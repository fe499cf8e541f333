"""Shared by the docker tests: the engine (or a one-line skip reason), test images, and patches that break a
PASS_TO_PASS test."""

from __future__ import annotations

import functools
import re
import shutil
import uuid
from typing import Any

import pytest

from repro.sandbox.docker_engine import DockerUnavailable, client, engine_available
from repro.sandbox.images import ImageBuildError, base_image_name, build_base_image
from repro.sandbox.local import LocalSandbox
from repro.sandbox.repos import apply_patch
from repro.tasks.schema import Task


@functools.cache
def _engine_or_reason() -> tuple[Any, str | None]:
    reason = engine_available()
    if reason:
        return None, f"no Docker engine here ({reason}); .ci/run starts one"
    engine = client()
    try:
        engine.images.get(base_image_name())
    except Exception:  # not built yet: build it (needs root + debootstrap), or say why not
        if shutil.which("debootstrap") is None:
            return None, "the test base image is not built and debootstrap is missing (.ci/run installs it)"
        try:
            build_base_image(engine)
        except (ImageBuildError, DockerUnavailable) as exc:
            return None, f"cannot build the test base image: {str(exc).splitlines()[0]}"
    return engine, None


def docker_engine() -> Any:
    """The engine with the test base image present; skips the calling test (one line why) otherwise."""
    engine, reason = _engine_or_reason()
    if reason:
        pytest.skip(reason)
    return engine


def _function_names(test_id: str) -> list[str]:
    name = test_id.rsplit("::", 1)[-1].split("[", 1)[0].removeprefix("test_")
    stripped = re.sub(r"_\d+$", "", name)
    return list(dict.fromkeys([name, stripped]))


def p2p_breaking_patch(sandbox: LocalSandbox, task: Task) -> str | None:
    """The gold patch plus a redefinition of a function a PASS_TO_PASS test is named after (raising), so the
    FAIL_TO_PASS tests can pass while that PASS_TO_PASS test fails; None when no such function is found."""
    workspace = sandbox.workspace(task, f"break-{uuid.uuid4().hex[:8]}")
    try:
        if apply_patch(workspace.path, task.patch):
            return None
        sources = [p for p in workspace.path.rglob("*.py") if "tests" not in p.relative_to(workspace.path).parts]
        for test_id in task.PASS_TO_PASS:
            for name in _function_names(test_id):
                for source in sources:
                    text = source.read_text()
                    if re.search(rf"^def {re.escape(name)}\(", text, re.M):
                        source.write_text(f"{text}\n\ndef {name}(*args, **kwargs):\n"
                                          "    raise RuntimeError('broken on purpose by the parity test')\n")
                        return workspace.diff()
        return None
    finally:
        workspace.cleanup()

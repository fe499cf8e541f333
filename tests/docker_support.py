"""Shared by the docker tests: the engine (or a one-line skip reason), test images, and patches that break a
PASS_TO_PASS test."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import repro.sandbox.images as images_module
from repro.common.files import cache_dir, locked
from repro.sandbox.docker_engine import DockerUnavailable, client, engine_available
from repro.sandbox.images import ImageBuildError, base_image_name, build_base_image, os_image_name
from repro.sandbox.local import LocalSandbox
from repro.sandbox.repos import apply_patch
from repro.tasks.schema import Task


def _has_image(engine: Any, name: str) -> bool:
    try:
        engine.images.get(name)
    except Exception:  # docker.errors.ImageNotFound
        return False
    return True


def saved_base_image() -> Path:
    """Where the test base image (with its OS base) is saved between runs: named by both images' tags (the hashes
    of their recipes) and by the code that builds them, so a change to either builds afresh."""
    code = hashlib.sha256(Path(images_module.__file__).read_bytes()).hexdigest()[:12]
    tags = "-".join(name.split(":", 1)[1] for name in (os_image_name(), base_image_name()))
    return cache_dir() / "docker-images" / f"repro-base-{tags}-{code}.tar"


def ensure_base_image(engine: Any, log: Callable[[str], None] = print) -> str | None:
    """The test base image in the engine: there already, loaded from :func:`saved_base_image` (``docker load``,
    seconds), or built (debootstrap, ~75 s) and saved for the next run; None, or why it cannot be had. Under a file
    lock, so the tests wait for the build ``.ci/run`` starts in the background instead of building it twice."""
    saved = saved_base_image()
    with locked(saved.with_suffix(".lock")):
        if _has_image(engine, base_image_name()):
            return None
        if saved.is_file():
            loaded = subprocess.run(["docker", "load", "-q", "-i", str(saved)], capture_output=True, text=True)
            if loaded.returncode == 0 and _has_image(engine, base_image_name()):
                log(f"images: loaded {base_image_name()} from {saved}")
                return None
        if shutil.which("debootstrap") is None:
            return "the test base image is not built and debootstrap is missing (.ci/run installs it)"
        try:
            build_base_image(engine, log)
        except (ImageBuildError, DockerUnavailable) as exc:
            return f"cannot build the test base image: {str(exc).splitlines()[0]}"
        _save(saved, log)
    return None


def _save(saved: Path, log: Callable[[str], None]) -> None:
    """``docker save`` of the base image and its OS base into ``saved`` (written aside, then renamed); a failure to
    save only costs the next run a build."""
    partial = saved.with_suffix(".partial")
    partial.parent.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(["docker", "save", "-o", str(partial), base_image_name(), os_image_name()],
                         capture_output=True, text=True)
    if out.returncode == 0:
        partial.replace(saved)
        log(f"images: saved {base_image_name()} to {saved}")
    else:
        partial.unlink(missing_ok=True)
        log(f"images: could not save {base_image_name()}: {out.stderr.strip()[-300:]}")


@functools.cache
def _engine_or_reason() -> tuple[Any, str | None]:
    reason = engine_available()
    if reason:
        return None, f"no Docker engine here ({reason}); .ci/run starts one"
    engine = client()
    missing = ensure_base_image(engine)
    return (None, missing) if missing else (engine, None)


def docker_engine() -> Any:
    """The engine with the test base image present; skips the calling test (one line why) otherwise, or fails it
    under ``REPRO_REQUIRE_DOCKER=1`` (CI)."""
    engine, reason = _engine_or_reason()
    if reason:
        if os.environ.get("REPRO_REQUIRE_DOCKER") == "1":
            pytest.fail(f"REPRO_REQUIRE_DOCKER=1: {reason}")
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


# A SWE-bench instance image's layout, made here (the published images cannot be pulled on this machine): the
# repository at base_commit in /testbed (its own history), a conda env named testbed that /root/.bashrc activates.
# The env is a stand-in (a shell function `conda` and PATH), the rest is swebench's own eval script and log parser.
CONDA_SHIM = ("conda() { :; }\nexport PATH=/opt/miniconda3/envs/testbed/bin:$PATH PYTHONPATH=/testbed "
              "PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1\n")
SWEBENCH_LIKE = {"repo": "pallets/flask", "version": "3.1"}  # a repo swebench knows: pytest -rA, its parser


def _layout_files() -> bytes:
    """The conda stand-in: ``activate`` (a no-op ``conda`` and the env's PATH), ``python``, ``/root/.bashrc``."""
    buffer = io.BytesIO()
    bashrc = "source /opt/miniconda3/bin/activate\nconda activate testbed\n"
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        link = tarfile.TarInfo("opt/miniconda3/envs/testbed/bin/python")
        link.type, link.linkname = tarfile.SYMTYPE, "/usr/bin/python3"
        tar.addfile(link)
        for path, text in (("opt/miniconda3/bin/activate", CONDA_SHIM), ("root/.bashrc", bashrc)):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(text.encode()), 0o644
            tar.addfile(info, io.BytesIO(text.encode()))
    return buffer.getvalue()


def swebench_layout_row(engine: Any, task: Task, number: int) -> Task:
    """A SWE-bench-schema row (fixture: ``repo``/``version`` of a repository swebench knows, a synthetic instance id)
    for a bundled task, and its image in swebench's naming with the instance image layout."""
    from repro.sandbox.images import base_image_name, swebench_image_name, tar_dir
    from repro.sandbox.local import LocalSandboxConfig

    row = dataclasses.replace(task, instance_id=f"pallets__flask-{90000 + number}", repo_path=None,
                              **SWEBENCH_LIKE, extra={"fixture": "synthetic row in SWE-bench's schema"})
    local = LocalSandbox(LocalSandboxConfig())
    workspace = local.workspace(task, f"layout-{number}")
    container = engine.containers.create(base_image_name(), command=["true"], network_mode="none")
    try:
        container.put_archive("/", tar_dir(workspace.path, "testbed"))
        container.put_archive("/", _layout_files())
        repository, tag = swebench_image_name(row.instance_id, "swebench", "latest").rsplit(":", 1)
        container.commit(repository, tag, changes=["WORKDIR /testbed"])
    finally:
        container.remove(force=True)
        workspace.cleanup()
        local.close()
    return dataclasses.replace(row, base_commit=workspace.base_commit)


# A SWE-smith image's layout, made here from a bundled task: /testbed holds the fixed repository (tests included) on
# `main`, and a branch named after the instance with a "Bug Patch" commit (the bug) and a "Remove F2P Tests" commit
# (the FAIL_TO_PASS test files deleted), as SWE-smith's mirrors have; the conda stand-in as above.
def _git(repo: Any, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=fixture@repro", "-c", "user.name=fixture",
                           *args], capture_output=True, text=True, check=True).stdout


def swesmith_layout_row(engine: Any, task: Task, number: int, namespace: str = "repro-fixture") -> Task:
    """A row in SWE-smith's exact schema for a bundled task (loaded through the task loader), and its image under
    the row's ``image_name``."""
    from repro.sandbox.images import base_image_name, tar_dir
    from repro.sandbox.local import LocalSandboxConfig
    from repro.tasks.loaders import row_to_task

    local = LocalSandbox(LocalSandboxConfig())
    workspace = local.workspace(task, f"smith-layout-{number}")
    repo = workspace.path
    try:
        for patch in (task.test_patch, task.patch):
            if patch.strip():
                assert not apply_patch(repo, patch), f"{task.instance_id}: fixture patch does not apply"
        _git(repo, "add", "-A")
        _git(repo, "commit", "-qm", "Initial commit")
        _git(repo, "checkout", "-q", "-B", "main")
        commit8 = _git(repo, "rev-parse", "HEAD").strip()[:8]
        owner, name = "repro-fixture", task.instance_id.split("-")[0] + f"{number}"
        instance_id = f"{owner}__{name}.{commit8}.func_pm_fixture__{number:08d}"
        _git(repo, "checkout", "-q", "-b", instance_id)
        subprocess.run(["git", "-C", str(repo), "apply", "-R", "-"], input=task.patch, text=True, check=True)
        _git(repo, "commit", "-qam", "Bug Patch")
        bug_patch = _git(repo, "diff", "main", "HEAD")
        f2p_files = sorted({t.split("::", 1)[0] for t in task.FAIL_TO_PASS})
        _git(repo, "rm", "-q", *f2p_files)
        _git(repo, "commit", "-qm", "Remove F2P Tests")
        _git(repo, "checkout", "-q", "main")
        image_name = f"{namespace}/swesmith.x86_64.{owner}_1776_{name}.{commit8}"
        container = engine.containers.create(base_image_name(), command=["true"], network_mode="none")
        try:
            container.put_archive("/", tar_dir(repo, "testbed"))
            container.put_archive("/", _layout_files())
            container.commit(image_name, "latest", changes=["WORKDIR /testbed"])
        finally:
            container.remove(force=True)
    finally:
        workspace.cleanup()
        local.close()
    row = {"instance_id": instance_id, "patch": bug_patch, "FAIL_TO_PASS": task.FAIL_TO_PASS,
           "PASS_TO_PASS": task.PASS_TO_PASS, "image_name": image_name, "repo": f"swesmith/{owner}__{name}.{commit8}",
           "problem_statement": task.problem_statement}
    return row_to_task(row, f"swesmith fixture {number}")


def leaky_swebench_row(engine: Any, task: Task, number: int) -> Task:
    """A SWE-bench-schema row whose image's ``/testbed`` holds the fix as a future commit: ``main`` runs past the
    base commit to a commit with ``test_patch`` and the gold patch in, tagged ``v-fixed``, on branch ``hotfix`` too,
    and HEAD is on a branch at the base commit (as an image built without scrubbing would have it)."""
    from repro.sandbox.images import base_image_name, swebench_image_name, tar_dir
    from repro.sandbox.local import LocalSandboxConfig

    row = dataclasses.replace(task, instance_id=f"pallets__flask-{95000 + number}", repo_path=None,
                              **SWEBENCH_LIKE, extra={"fixture": "SWE-bench row whose image holds the fix"})
    local = LocalSandbox(LocalSandboxConfig())
    workspace = local.workspace(task, f"leaky-layout-{number}")
    repo = workspace.path
    try:
        _git(repo, "checkout", "-q", "-b", "main")
        base = _git(repo, "rev-parse", "HEAD").strip()
        for patch in (task.test_patch, task.patch):
            if patch.strip():
                assert not apply_patch(repo, patch), f"{task.instance_id}: fixture patch does not apply"
        _git(repo, "add", "-A")
        _git(repo, "commit", "-qm", "Fix the bug")
        _git(repo, "tag", "v-fixed")
        _git(repo, "branch", "hotfix")
        _git(repo, "checkout", "-q", "-b", "work", base)
        container = engine.containers.create(base_image_name(), command=["true"], network_mode="none")
        try:
            container.put_archive("/", tar_dir(repo, "testbed"))
            container.put_archive("/", _layout_files())
            repository, tag = swebench_image_name(row.instance_id, "swebench", "latest").rsplit(":", 1)
            container.commit(repository, tag, changes=["WORKDIR /testbed"])
        finally:
            container.remove(force=True)
    finally:
        workspace.cleanup()
        local.close()
    return dataclasses.replace(row, base_commit=base)

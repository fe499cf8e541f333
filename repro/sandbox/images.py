"""Docker images for the bundled task distributions, built here with no registry, cached by content hash.

Layout as SWE-bench's instance images: the task's repository at its base commit in ``/testbed`` (a git working
copy whose only commit is the base tree: nothing of the fix's history), working directory ``/testbed``.

- **OS base** ``repro/os:<hash>``: Debian (``debootstrap --variant=minbase``) with python3, pip, git and patch,
  imported with ``docker import`` (needs root and ``debootstrap``; the Debian mirror apt already uses).
- **Test base** ``repro/base:<hash>``: the OS base plus the pinned grading pytest, installed from wheels the host
  downloads (the container never reaches the network).
- **Task image** ``<namespace>/sweb.eval.x86_64.<instance id, "__" -> "_1776_">:<hash>`` (swebench's naming):
  the test base plus ``/testbed``. The base commit's sha inside the image is a label (``repro.base_commit``).

A tag carries the hash of everything that went into the image, so an existing tag is a cache hit.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.sandbox.docker_engine import ImageMissing
from repro.sandbox.grading_env import GRADING_PYTEST
from repro.sandbox.repos import RepoResolver, git, make_agent_copy, remove_tree
from repro.tasks.schema import Task

DEBIAN_SUITE = "bookworm"
OS_PACKAGES = ("python3", "python-is-python3", "python3-pip", "git", "patch")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
APT_SOURCES = (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list"))
LABEL_BASE_COMMIT = "repro.base_commit"
LABEL_RECIPE = "repro.recipe"
WORKDIR = "/testbed"
BUNDLED_NAMESPACE = "repro-bundled"


class ImageBuildError(RuntimeError):
    """An image could not be built (the message says which step and why)."""


def _hash(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def debian_mirror() -> str:
    """The Debian mirror apt on this machine already uses (``deb.debian.org`` when none is configured)."""
    for path in APT_SOURCES:
        if path.is_file():
            found = re.search(r"^(?:URIs:\s*|deb\s+(?:\[[^]]*\]\s*)?)(\S+/debian)/?\s*$", path.read_text(), re.M)
            if found:
                return found.group(1)
    return DEFAULT_MIRROR


def os_recipe() -> dict[str, Any]:
    return {"suite": DEBIAN_SUITE, "variant": "minbase", "packages": list(OS_PACKAGES)}


def base_recipe() -> dict[str, Any]:
    return {"os": os_recipe(), "pytest": GRADING_PYTEST}


def os_image_name() -> str:
    return f"repro/os:{_hash(os_recipe())}"


def base_image_name() -> str:
    return f"repro/base:{_hash(base_recipe())}"


def swebench_image_name(instance_id: str, namespace: str, tag: str) -> str:
    """swebench's instance image name: ``<namespace>/sweb.eval.x86_64.<id, "__" -> "_1776_", lower>:<tag>``."""
    key = instance_id.replace("__", "_1776_").lower()
    return f"{namespace}/sweb.eval.x86_64.{key}:{tag}" if namespace else f"sweb.eval.x86_64.{key}:{tag}"


def _has_image(engine: Any, name: str) -> bool:
    import docker.errors

    try:
        engine.images.get(name)
    except docker.errors.ImageNotFound:
        return False
    return True


def _run(argv: Sequence[str], what: str, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    try:
        proc = subprocess.run(list(argv), capture_output=True, **kwargs)
    except OSError as exc:
        raise ImageBuildError(f"{what}: cannot run {argv[0]} ({exc})") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout or b"").decode(errors="replace")[-2000:]
        raise ImageBuildError(f"{what}: {argv[0]} exited {proc.returncode}:\n{tail}")
    return proc


def build_os_image(engine: Any, log: Callable[[str], None] = print) -> str:
    """The OS base (debootstrap + ``docker import``), built once per recipe; its name."""
    name = os_image_name()
    if _has_image(engine, name):
        return name
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("building the OS base image needs debootstrap (`apt-get install debootstrap`) and root")
    started = time.monotonic()
    rootfs = Path(tempfile.mkdtemp(prefix="repro-rootfs-"))
    try:
        _run(["debootstrap", "--variant=minbase", f"--include={','.join(OS_PACKAGES)}", DEBIAN_SUITE, str(rootfs),
              debian_mirror()], "debootstrap")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        _run(["docker", "import", "--change", f"LABEL {LABEL_RECIPE}={_hash(os_recipe())}", "-", name],
             "docker import", stdin=tar.stdout)
        tar.wait()
    finally:
        remove_tree(rootfs)
    log(f"images: built {name} in {time.monotonic() - started:.0f} s")
    return name


def _pytest_wheels(dest: Path) -> None:
    _run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", str(dest),
          f"pytest=={GRADING_PYTEST}"], "downloading pytest wheels on the host")


def build_base_image(engine: Any, log: Callable[[str], None] = print) -> str:
    """The test base (OS base + pinned pytest from host-downloaded wheels); its name."""
    name = base_image_name()
    if _has_image(engine, name):
        return name
    os_name = build_os_image(engine, log)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="repro-wheels-") as tmp:
        _pytest_wheels(Path(tmp))
        container = engine.containers.create(os_name, command=["sleep", "600"], network_mode="none")
        try:
            container.start()
            container.put_archive("/tmp", tar_dir(Path(tmp), "wheels"))
            code, out = container.exec_run(["bash", "-c", "python3 -m pip install --quiet --no-index --find-links "
                                            f"/tmp/wheels --break-system-packages pytest=={GRADING_PYTEST} "
                                            "&& rm -rf /tmp/wheels /root/.cache"])
            if code != 0:
                raise ImageBuildError(f"installing pytest in the base image failed:\n{out.decode(errors='replace')}")
            container.stop(timeout=1)
            repository, tag = name.split(":")
            container.commit(repository, tag, changes=[f"WORKDIR {WORKDIR}",
                                                       f"LABEL {LABEL_RECIPE}={_hash(base_recipe())}"])
        finally:
            container.remove(force=True)
    log(f"images: built {name} in {time.monotonic() - started:.0f} s")
    return name


def tar_dir(folder: Path, arcname: str) -> bytes:
    """``folder`` as an uncompressed tar archive whose root is named ``arcname`` (for ``put_archive``)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(folder, arcname=arcname)
    return buffer.getvalue()


@dataclass(frozen=True)
class TaskImage:
    """A task's image: its name and the sha of the base commit in its ``/testbed``."""

    instance_id: str
    name: str
    base_commit: str


def task_image_name(task: Task, resolver: RepoResolver, base: str, namespace: str = BUNDLED_NAMESPACE) -> str:
    """The task image's name; its tag hashes the base image's name, the instance id and the base tree's sha."""
    repo, sha = resolver.resolve(task)
    tree = git(["rev-parse", f"{sha}^{{tree}}"], repo.path).stdout.strip()
    tag = _hash({"base": base, "instance_id": task.instance_id, "tree": tree})
    return swebench_image_name(task.instance_id, namespace, tag)


def build_task_image(engine: Any, task: Task, resolver: RepoResolver, base: str,
                     namespace: str = BUNDLED_NAMESPACE) -> tuple[TaskImage, bool]:
    """The task's image on top of ``base`` (built unless its tag exists); whether it was built now."""
    repo, sha = resolver.resolve(task)
    name = task_image_name(task, resolver, base, namespace)
    if _has_image(engine, name):
        return TaskImage(task.instance_id, name, engine.images.get(name).labels[LABEL_BASE_COMMIT]), False
    with tempfile.TemporaryDirectory(prefix="repro-testbed-") as tmp:
        root = make_agent_copy(repo, sha, Path(tmp) / "testbed")
        container = engine.containers.create(base, command=["true"], network_mode="none")
        try:
            container.put_archive("/", tar_dir(Path(tmp) / "testbed", WORKDIR.strip("/")))
            repository, tag = name.rsplit(":", 1)
            container.commit(repository, tag, changes=[f"WORKDIR {WORKDIR}", f"LABEL {LABEL_BASE_COMMIT}={root}"])
        finally:
            container.remove(force=True)
    return TaskImage(task.instance_id, name, root), True


def require_task_image(engine: Any, task: Task, resolver: RepoResolver, namespace: str = BUNDLED_NAMESPACE
                       ) -> TaskImage:
    """The task's image, which must exist already (never built implicitly in an evaluation)."""
    name = task_image_name(task, resolver, base_image_name(), namespace)
    if not _has_image(engine, name):
        raise ImageMissing(f"image {name!r} for task {task.instance_id} is not on this Docker engine: build it "
                           "with `repro images build` (same task distribution)")
    return TaskImage(task.instance_id, name, engine.images.get(name).labels[LABEL_BASE_COMMIT])


def build_task_images(engine: Any, tasks: Sequence[Task], resolver: RepoResolver,
                      log: Callable[[str], None] = print) -> dict[str, Any]:
    """Base and task images for ``tasks``; a summary (counts, seconds) of what was built."""
    started = time.monotonic()
    base = build_base_image(engine, log)
    built = 0
    images = {}
    for task in tasks:
        image, new = build_task_image(engine, task, resolver, base)
        images[task.instance_id] = image
        built += new
    seconds = time.monotonic() - started
    log(f"images: {len(tasks)} task images ({built} built, {len(tasks) - built} cached) in {seconds:.1f} s")
    return {"base": base, "tasks": len(tasks), "built": built, "cached": len(tasks) - built, "seconds": seconds,
            "images": images}

"""The docker sandbox: one container per rollout from the task's image, grading in a fresh container.

Grading follows swebench's ``run_instance``: the agent's patch (less the files it may not change, as in the local
sandbox) is copied in and applied with the first of swebench's ``GIT_APPLY_CMDS`` that works, then the eval script
(:mod:`repro.sandbox.eval_script`) runs under a wall-clock bound and its log is parsed; the verdict rule is the
local sandbox's (:func:`repro.sandbox.grading.decide`). Faults of the container itself (OOM, an engine call that
fails, a missing image) are infrastructure errors, never an unresolved task.

A rollout's container has its git history replaced before the agent starts (``scrub_history``,
:mod:`repro.sandbox.history`): one root commit of the tree it was given, kept under ``refs/repro/base``, which the
rollout's patch is taken against. Grading containers keep the image's history (the eval script needs it).
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swebench.harness.run_evaluation import GIT_APPLY_CMDS

from repro.common.lifecycle import Closing
from repro.execution.pytest_runner import TestRun
from repro.protocols import ContainerSpec, GradeResult, HarnessResult, Workspace
from repro.sandbox import docker_engine as engine_api
from repro.sandbox.docker_engine import ContainerLimits, ExecResult, exec_bounded, put_file, run_labels
from repro.sandbox.eval_script import GRADING_ENV, eval_spec, test_exit_code
from repro.sandbox.grading import LOG_TAIL_CHARS, added_hook_files, decide, protected_paths
from repro.sandbox.history import BASE_REF, scrub_command
from repro.sandbox.images import BUNDLED_NAMESPACE, TaskImage, require_task_image, swebench_image_name
from repro.sandbox.repos import RepoResolver
from repro.tasks.materialize import REPO_OWNER
from repro.tasks.schema import Task
from repro.tasks.swesmith import is_swesmith, startup_command

PATCH_PATH = "/tmp/patch.diff"
EVAL_PATH = "/eval.sh"
_SECTION = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)


@dataclass
class DockerSandboxConfig:
    """Images, limits and bounds of the docker sandbox."""

    repos_dir: str = "repos"  # where bundled task repositories resolve (image tags hash their base trees)
    bundled_namespace: str = BUNDLED_NAMESPACE  # bundled tasks' images (`repro images build`)
    namespace: str = "swebench"  # other rows without an ``image_name``: swebench's instance image naming
    tag: str = "latest"  # ... and tag (pin by digest: the frozen spec records each image's content id)
    limits: ContainerLimits = field(default_factory=ContainerLimits)
    test_timeout_s: float = 300.0  # wall-clock bound of one eval script
    command_timeout_s: float = 60.0  # wall-clock bound of one command in a rollout's container
    scrub_history: bool = True  # the agent's repository: one root commit of its tree, no other history (history.py)
    setup_timeout_s: float = 300.0  # wall-clock bound of a rollout container's set-up (checkout + history scrub)
    run_id: str = ""  # labels containers; "" = a fresh id per sandbox


def drop_files(patch: str, paths: tuple[str, ...]) -> str:
    """``patch`` without the ``diff --git`` sections of ``paths`` (as ``git apply --exclude`` would skip them)."""
    if not paths:
        return patch
    starts = [m.start() for m in _SECTION.finditer(patch)]
    if not starts:
        return patch
    kept = [patch[:starts[0]]]
    for begin, end in zip(starts, [*starts[1:], len(patch)], strict=True):
        section = patch[begin:end]
        match = _SECTION.match(section)
        if match and not {match.group(1), match.group(2)} & set(paths):
            kept.append(section)
    return "".join(kept)


@dataclass
class DockerWorkspace:
    """A rollout's container (from the task's image); ``path`` is the working tree inside it."""

    container: Any
    image: TaskImage
    base_commit: str
    path: Path = Path("/testbed")
    command_timeout_s: float = 60.0

    def run(self, command: str, timeout_s: float | None = None) -> ExecResult:
        return exec_bounded(self.container, command, timeout_s or self.command_timeout_s, str(self.path))

    def diff(self) -> str:
        """The working tree against the base commit, new files included, the agent's own index untouched."""
        result = self.run(diff_command(self.base_commit))
        if result.exit_code != 0:
            raise OSError(f"git diff in the container failed (exit {result.exit_code}): {result.output[-500:]}")
        return result.output

    def cleanup(self) -> None:
        engine_api.remove_quietly([self.container])


@dataclass
class HarnessContainer:
    """A rollout whose container the harness starts and removes; ``diff`` is what it reported from inside."""

    container_spec: ContainerSpec
    image: TaskImage
    engine: Any = None  # with rollout_id: cleanup removes any container of the rollout its harness left behind
    rollout_id: str = ""
    path: Path = Path("/testbed")
    patch: str | None = None
    problem: str = "the harness reported no patch (it ended before the container was read)"

    def adopt(self, result: HarnessResult) -> None:
        """Take the patch the harness printed inside the container before removing it."""
        if isinstance(result.info.get("diff"), str):
            self.patch = result.info["diff"]
        elif result.info.get("diff_error"):
            self.problem = f"reading the patch in the container failed: {result.info['diff_error']}"

    def diff(self) -> str:
        if self.patch is None:
            raise OSError(self.problem)
        return self.patch

    def cleanup(self) -> None:
        """The harness removes its container; one it left (killed after a timeout) is removed here, by the
        rollout's label (the sandbox's ``close`` removes any the run left)."""
        if self.engine is not None and self.rollout_id:
            engine_api.remove_quietly(engine_api.labelled(self.engine, f"{engine_api.LABEL_ROLLOUT}={self.rollout_id}"))


def diff_command(base_commit: str) -> str:
    """A shell command printing the working tree's patch against ``base_commit``, new files included. It stages into
    a private index read from ``base_commit`` itself, which holds no stat data, so every file is hashed: a copy of the
    agent's index (its stat cache) once let an edit within the same timestamp as the checkout go unseen."""
    return ("set -e; export GIT_INDEX_FILE=$(mktemp); "
            f"git read-tree {base_commit} >/dev/null 2>&1; "
            "git add -A >/dev/null 2>&1; git diff --cached --binary --no-color --no-ext-diff --no-textconv "
            f"--no-renames {base_commit} 2>/dev/null; rm -f \"$GIT_INDEX_FILE\"")


class DockerSandbox(Closing):
    """Implements ``repro.protocols.Sandbox`` with a Docker engine; safe to share between threads."""

    gives_containers = True  # workspaces are container specs: the harness must act inside them

    def __init__(self, config: DockerSandboxConfig | None = None, engine: Any = None) -> None:
        self.config = config or DockerSandboxConfig()
        self.run_id = self.config.run_id or f"repro-{uuid.uuid4().hex[:12]}"
        self.engine = engine or engine_api.client()
        self.resolver = RepoResolver(Path(self.config.repos_dir).expanduser())
        self._lock = threading.Lock()

    def image(self, task: Task) -> TaskImage:
        """The task's image: bundled tasks' from ``repro images build``; a row's ``image_name`` (SWE-smith) or
        ``docker_image``; else swebench's instance image name. :class:`ImageMissing` says how to get it."""
        if task.repo.split("/", 1)[0] == REPO_OWNER:
            return require_task_image(self.engine, task, self.resolver, self.config.bundled_namespace)
        name = task.extra.get("image_name") or task.extra.get("docker_image") or \
            swebench_image_name(task.instance_id, self.config.namespace, self.config.tag)
        engine_api.image_id(self.engine, name)
        return TaskImage(task.instance_id, name, task.base_commit)

    def _labels(self, role: str, rollout_id: str | None = None) -> dict[str, str]:
        labels = run_labels(self.run_id, role)
        return labels | {engine_api.LABEL_ROLLOUT: rollout_id} if rollout_id is not None else labels

    def _start(self, image: str, role: str, rollout_id: str | None = None) -> Any:
        return self.engine.containers.run(image, command=["sleep", "infinity"], detach=True,
                                          labels=self._labels(role, rollout_id), working_dir="/testbed",
                                          **self.config.limits.sdk_kwargs())

    def setup_command(self, task: Task) -> str:
        """What runs in a rollout's container before the agent starts: the SWE-smith checkout, then (with
        ``scrub_history``) the history scrub; "" when nothing has to."""
        checkout = startup_command(task)
        if not self.config.scrub_history:
            return checkout
        scrub = scrub_command("main" if is_swesmith(task) else None)  # the instance branch's name tells the bug
        return f"{checkout} || exit 1\n{scrub}" if checkout else scrub

    def _diff_base(self, image: TaskImage) -> str:
        return BASE_REF if self.config.scrub_history else image.base_commit

    def workspace(self, task: Task, rollout_id: str) -> HarnessContainer:
        """Where a harness acts for this rollout: the container spec it starts through its own environment class
        (the task's image, limits, network off, this run's labels, the set-up command); the patch comes back with
        its result."""
        image = self.image(task)
        labels = self._labels("rollout", rollout_id)
        spec = ContainerSpec(image.name, "/testbed", [*self.config.limits.run_args(), *engine_api.label_args(labels)],
                             diff_command(self._diff_base(image)), self.config.command_timeout_s,
                             self.setup_command(task), self.config.setup_timeout_s)
        return HarnessContainer(spec, image, self.engine, rollout_id)

    def open_container(self, task: Task, rollout_id: str) -> DockerWorkspace:
        """A container of the task's image started here (a fresh working tree: the image's, set up as for a
        harness), for code that runs commands itself (tests, a trainer-owned loop)."""
        image = self.image(task)
        container = self._start(image.name, "rollout", rollout_id)
        if command := self.setup_command(task):
            started = exec_bounded(container, command, self.config.setup_timeout_s)
            if started.exit_code:
                engine_api.remove_quietly([container])
                why = f"timed out after {self.config.setup_timeout_s:g} s (sandbox.setup_timeout_s)" \
                    if started.timed_out else f"exited {started.exit_code}"
                raise OSError(f"setting up the rollout container of {task.instance_id} ({image.name}) {why}: "
                              f"{started.output[-500:]}")
        return DockerWorkspace(container, image, self._diff_base(image),
                               command_timeout_s=self.config.command_timeout_s)

    def grade(self, task: Task, workspace: Workspace) -> GradeResult:
        try:
            patch = workspace.diff()
        except OSError as exc:
            return GradeResult("unresolved", f"could not read the workspace's changes: {exc}")
        return self.grade_patch(task, patch)

    def grade_patch(self, task: Task, patch: str) -> GradeResult:
        """Grade ``patch`` in a fresh container of the task's image; engine faults are ``error``."""
        import docker.errors

        started = time.monotonic()
        try:
            result = self._grade(task, patch)
        except engine_api.ImageMissing as exc:
            result = GradeResult("error", str(exc))
        except (docker.errors.DockerException, OSError) as exc:
            result = GradeResult("error", f"docker engine call failed: {type(exc).__name__}: {exc}")
        result.duration_s = time.monotonic() - started
        return result

    def _grade(self, task: Task, patch: str) -> GradeResult:
        if not task.FAIL_TO_PASS:
            return GradeResult("error", f"task {task.instance_id} names no FAIL_TO_PASS test")
        image = self.image(task)
        container = self._start(image.name, "grade")
        try:
            return self._grade_in(container, task, image, patch)
        finally:
            engine_api.remove_quietly([container])

    def _grade_in(self, container: Any, task: Task, image: TaskImage, patch: str) -> GradeResult:
        spec = eval_spec(task, image.base_commit)
        if spec.prepare:
            prepared = exec_bounded(container, spec.prepare, 120, "/testbed")
            if prepared.exit_code != 0:
                return GradeResult("error", f"could not prepare the grading container ({spec.source}): "
                                   f"`{spec.prepare}` exited {prepared.exit_code}",
                                   log_tail=prepared.output[-LOG_TAIL_CHARS:])
        if task.test_patch.strip():
            put_file(container, "/tmp/test.diff", task.test_patch.encode())
            check = exec_bounded(container, "git apply --check /tmp/test.diff", 60)
            if check.exit_code != 0:
                return GradeResult("error", "test_patch does not apply at base_commit",
                                   log_tail=check.output[-LOG_TAIL_CHARS:])
        hooks = added_hook_files(patch)
        applied = drop_files(patch, (*protected_paths(task), *hooks))
        empty = not patch.strip()
        if applied.strip() and (problem := self._apply(container, applied)):
            return GradeResult("unresolved", "patch does not apply", log_tail=problem[-LOG_TAIL_CHARS:])
        put_file(container, EVAL_PATH, spec.script.encode(), mode=0o755)
        run = exec_bounded(container, f"{EVAL_PATH} 2>&1", self.config.test_timeout_s, environment=GRADING_ENV)
        oom = _oom_killed(container)
        if oom:
            return GradeResult("error", f"the grading container ran out of memory ({self.config.limits.memory_mb} "
                               "MB, sandbox.limits.memory_mb)", log_tail=run.output[-LOG_TAIL_CHARS:])
        result = decide(task, _test_run(run, spec.parse, self.config.test_timeout_s))
        if empty and result.outcome == "unresolved":
            result.reason = f"empty patch; {result.reason}"
        if hooks:
            result.reason = f"{result.reason}; left out of the patch (files that run around the tests): " \
                            f"{', '.join(hooks)}"
        return result

    def _apply(self, container: Any, patch: str) -> str | None:
        """swebench's patch commands in order; None once one applies, else their combined output."""
        put_file(container, PATCH_PATH, patch.encode())
        outputs = []
        for command in GIT_APPLY_CMDS:
            result = exec_bounded(container, f"{command} {PATCH_PATH}", 60)
            if result.exit_code == 0:
                return None
            outputs.append(f"$ {command}\n{result.output}")
        return "\n".join(outputs)

    def close(self) -> None:
        """Remove every container of this sandbox's run."""
        engine_api.remove_run_containers(self.engine, self.run_id)


def _test_run(run: ExecResult, parse: Any, timeout_s: float) -> TestRun:
    exit_code = test_exit_code(run.output)
    statuses = {} if run.timed_out else parse(run.output)
    return TestRun(statuses, run.exit_code if exit_code is None else exit_code, run.timed_out, run.duration_s,
                   run.output, timeout_s)


def _oom_killed(container: Any) -> bool:
    """Whether the kernel's OOM killer acted in the container's cgroup (``memory.oom_control``/``memory.events``)."""
    result = exec_bounded(container, "cat /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null || "
                                     "cat /sys/fs/cgroup/memory.events 2>/dev/null", 10, workdir="/")
    found = re.search(r"^oom_kill (\d+)$", result.output, re.M)
    return bool(found and int(found.group(1)) > 0)

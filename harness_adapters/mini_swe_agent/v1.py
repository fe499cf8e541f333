"""mini-SWE-agent 1.x (pin 1.17.5, text mode) behind the ``Harness`` contract: one real ``mini`` per rollout.

Invocation (1.17.5; ``mini`` is the console script)::

    <env>/bin/mini -y --exit-immediately -m openai/<model> -l 0 -o <out>/trajectory.traj.json
        -c <out>/config/repro-mswea-v1-run.yaml --task=<problem statement>

run with cwd=<workdir>, stdin=<limit answers file>, its own session, and the clean environment of
``mini_swe_agent.build_process_env`` (isolated HOME/XDG dirs, no network besides ``api_base``).

Findings from reading the 1.17.5 source (``minisweagent/run/mini.py`` and what it builds), where it differs
from 2.x:

- Config: exactly one ``-c`` file (a path; no ``key=value`` specs, no merging of several files) and no
  ``--environment-class`` (always ``LocalEnvironment``). So the per-rollout file is the merge of the base (the
  builtin ``mini.yaml``, copied unchanged), the settings overlay and the rollout overlay (``api_base``,
  ``environment.cwd``). The identity hashes the base and settings files, exactly as for 2.x.
- Task: only ``-t`` (argv, so Linux caps it at 128 KiB: a longer statement crashes with E2BIG); a ``run.task``
  in the config is not read. It is passed as ``--task=<text>`` so that text starting with ``-`` stays a value.
- Text mode only: one ```` ```bash ```` block per reply (``action_regex``), no ``tools`` in the request; the
  model class is LiteLLM's (same pinned LiteLLM / OpenAI SDK, hence the same wire as 2.x). The agent config has
  no ``wall_time_limit_seconds``.
- Exits: ``Submitted`` (first output line ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``) and ``LimitsExceeded``
  (step / cost limit). A reply without exactly one block is answered with ``format_error_template`` and costs a
  step: there is no ``RepeatedFormatError`` and no ``TimeExceeded``. Any other error in the agent loop (endpoint
  down, ...) is caught by ``mini``: exit code 0, ``exit_status`` = the exception's class name and
  ``info.traceback`` in the trajectory; here that rollout is ``crashed``. Errors before the loop exit 1.
- Step limit: the interactive agent catches ``LimitsExceeded`` and asks for new limits with ``input()``, even
  when stdin is not a TTY (2.x checks), so with stdin=/dev/null a hit limit ends as ``EOFError``. stdin is a file
  answering both prompts with the same limits (``<step_limit>`` and ``0``): the re-check fails again and the run
  ends as ``LimitsExceeded``. Agent commands inherit that stdin: one that reads it up (``cat`` without a file)
  leaves the prompt at EOF and the rollout crashes with ``EOFError``.
- Trajectory (``trajectory_format: mini-swe-agent-1``): written once, at the end; a killed run leaves none.
- Commands: ``subprocess.run(shell=True)`` in ``mini``'s own process group (killed with it on timeout),
  env = the harness env + ``environment.env``. ``MSWEA_SILENT_STARTUP`` hides its start-up banner.

Inside a task container (``rollout.container`` set, ``sandbox=docker``): ``mini`` cannot select an environment
class, so each rollout runs :mod:`harness_adapters.mini_swe_agent.v1_docker` with the 1.x Python, which follows
mini's ``run/extra/swebench_single.py`` (``get_sb_environment``: its own ``DockerEnvironment`` with the environment
block of its ``config/extra/swebench.yaml``, the start-up command, the ``InteractiveAgent``). The config is that
runner's: ``config/extra/swebench.yaml`` (its templates; ``mini.yaml``'s instance template needs the local
environment's ``uname`` variables, which ``DockerEnvironment`` does not provide), the settings overlay, and the
container's image, ``docker run`` options and command timeout. 1.x's
``DockerEnvironment`` has no ``interpreter`` setting, so a command past its timeout stops only its ``docker exec``
client: the command itself runs on inside the container until the rollout's container is removed (at the
rollout's end, or at its timeout by this harness); the container's CPU, memory and pids limits bound it meanwhile.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from harness_adapters.forked import ForkServer
from harness_adapters.isolation import JAIL_WORKDIR, resolve_isolation, rollout_jail
from harness_adapters.merge import merge_configs
from harness_adapters.mini_swe_agent.adapter import (
    CONFIG_NAMES,
    NAME,
    RESULT_NAME,
    TRAJECTORY_NAME,
    MiniSweAgentConfig,
    build_process_env,
    ensure_mini_swe_agent_env,
    is_v1,
    litellm_model_name,
    rollout_settings,
    swebench_config,
    write_harness_config,
    write_yaml,
)
from harness_adapters.mini_swe_agent.outcome import HarnessRunResult, classify_run, trajectory_info
from harness_adapters.per_rollout import PerRolloutHarness
from harness_adapters.processes import TAIL_CHARS, ProcessOutcome, last_line, run_in_session
from repro.common.venvs import HarnessEnv
from repro.execution.jail import interpreter_paths
from repro.protocols import ContainerSpec, HarnessResult, HarnessRollout

__all__ = ["FINISHED_EXIT_STATUSES", "V1_VERSION", "MiniSweAgentV1Harness", "build_command", "merge_configs"]

V1_VERSION = "1.17.5"
FINISHED_EXIT_STATUSES = ("Submitted", "LimitsExceeded")
RUN_CONFIG_NAME = "repro-mswea-v1-run.yaml"
DOCKER_RUNNER = Path(__file__).with_name("v1_docker.py")
DIFF_NAME = "container.diff"
ANSWERS_NAME = "repro-mswea-v1-stdin.txt"
V1_ENV = {"MSWEA_SILENT_STARTUP": "1"}
LAUNCHERS = ("fork", "exec")
MINI_ENTRY = "minisweagent.run.mini:app"  # what the ``mini`` console script calls
MINI_PRELOAD = ("litellm", "minisweagent.models.litellm_model")  # imported on a rollout's first model call


def rollout_overlay(base_url: str, workdir: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The per-rollout part of the config (endpoint, working directory, the commands' environment from the
    sandbox); 1.x takes the task from ``-t``."""
    return {k: v for k, v in rollout_settings("", base_url, workdir, env=env).items() if k != "run"}


def container_overlay(container: ContainerSpec, swebench_block: Mapping[str, Any]) -> dict[str, Any]:
    """The container part of a 1.x rollout's config: mini's SWE-bench environment block (``cwd``, ``env``, ...)
    with the rollout's image, ``docker run`` options and command timeout, and its start-up command."""
    environment = {**swebench_block, "environment_class": "docker", "image": container.image, "cwd": container.cwd,
                   "run_args": ["--rm", *container.run_args], "timeout": int(container.command_timeout_s)}
    run = {"env_startup_command": container.startup_command} if container.startup_command else {}
    if container.startup_command and container.startup_timeout_s:
        run["env_startup_timeout"] = int(container.startup_timeout_s)  # read by v1_docker.py
    return {"environment": environment, "run": run}


def limit_answers(cfg: MiniSweAgentConfig) -> str:
    """stdin for ``mini``: its answers to the two new-limit prompts at the step limit (the same limits)."""
    return f"{cfg.step_limit}\n0\n"


def build_command(env: HarnessEnv, model_name: str, trajectory: Path, config_path: Path, task: str) -> list[str]:
    """The exact 1.x ``mini`` command line for one rollout."""
    return [str(env.script("mini")), "-y", "--exit-immediately", "-m", litellm_model_name(model_name), "-l", "0",
            "-o", str(trajectory), "-c", str(config_path), f"--task={task}"]


class MiniSweAgentV1Harness(PerRolloutHarness):
    """mini-SWE-agent 1.x: each rollout one ``mini`` process, up to ``concurrency`` at once (threads).

    ``launcher="fork"`` (the default): each ``mini`` is a child of a fork server that has imported ``mini`` and
    LiteLLM once (:mod:`harness_adapters.forked`); same command line, config, environment, session, stdin and
    logs, ~3 CPU-s less a rollout. ``"exec"``: a fresh ``mini`` process (the reference). Rollouts in containers
    always exec the 1.x docker runner."""

    name = NAME
    thread_prefix = "mswea1"
    cfg: MiniSweAgentConfig
    acts_in_containers = True  # a rollout with a ContainerSpec runs in mini's own DockerEnvironment

    def __init__(self, cfg: MiniSweAgentConfig | None = None, workers: int = 1, *, env: HarnessEnv | None = None,
                 state_dir: Path | None = None, launcher: str = "fork") -> None:
        if launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")
        self.cfg = cfg or MiniSweAgentConfig(version=V1_VERSION, mode="text")
        if not is_v1(self.cfg.version):
            raise ValueError(f"MiniSweAgentV1Harness runs mini-SWE-agent 1.x, got version {self.cfg.version!r}")
        self._env = env or ensure_mini_swe_agent_env(self.cfg.version)
        state = self.use_state_dir(state_dir, "repro-mswea1-")
        self._config_dir = state / "config"
        self._identity = write_harness_config(self._env, self.cfg, self._config_dir)
        self.version = self._identity.version
        self._base = merge_configs(*(yaml.safe_load((self._config_dir / n).read_text(encoding="utf-8")) or {}
                                     for n in CONFIG_NAMES.values()))
        settings = self._config_dir / CONFIG_NAMES["settings"]
        self._container_base = merge_configs(swebench_config(self._env.site_packages),
                                             yaml.safe_load(settings.read_text(encoding="utf-8")) or {})
        self._answers = self._config_dir / ANSWERS_NAME
        self._answers.write_text(limit_answers(self.cfg))
        self._proc_env = build_process_env(self.cfg, home=state / "home", config_dir=self._config_dir) | V1_ENV
        self.launcher = launcher
        self._isolation = resolve_isolation(self.cfg.isolation)  # local rollouts; containers are their own
        self._forks = ForkServer(self._env.python, MINI_ENTRY, self._proc_env, state / "fork_server.log",
                                 MINI_PRELOAD) if launcher == "fork" else None

    def identity(self) -> dict[str, Any]:
        """Name, version, hashes of the base and settings files, litellm/openai versions, whether local rollouts
        run jailed (as for 2.x)."""
        return asdict(self._identity) | {"isolation": self._isolation}

    def run_config(self, rollout: HarnessRollout) -> dict[str, Any]:
        """The single config file ``mini`` gets for ``rollout``: base + settings + rollout overlay; in a container,
        mini's SWE-bench config (its runner's templates and environment block) + settings + the container."""
        if rollout.container is None:  # jailed, the working copy is at JAIL_WORKDIR in the jail
            workdir = Path(JAIL_WORKDIR) if self._isolation == "jail" else Path(rollout.workdir).resolve()
            return merge_configs(self._base, rollout_overlay(rollout.base_url, workdir, rollout.env))
        overlay = {"model": {"model_kwargs": {"api_base": rollout.base_url}}}
        block = dict(self._container_base.get("environment") or {})
        return merge_configs(self._container_base, overlay, container_overlay(rollout.container, block))

    def run_one(self, rollout: HarnessRollout) -> HarnessResult:
        """One ``mini`` (or, in a container, the 1.x docker runner) for ``rollout``; its record in ``output_dir``."""
        workdir, output_dir = Path(rollout.workdir).resolve(), Path(rollout.output_dir).resolve()
        config_path = output_dir / "config" / RUN_CONFIG_NAME
        config_path.parent.mkdir(parents=True, exist_ok=True)
        write_yaml(config_path, self.run_config(rollout))
        trajectory = output_dir / TRAJECTORY_NAME
        trajectory.unlink(missing_ok=True)
        if rollout.container is None:
            cmd = build_command(self._env, rollout.model_name, trajectory, config_path, rollout.task.problem_statement)
        else:
            cmd, workdir = self._container_command(rollout, config_path, trajectory), output_dir
        try:
            outcome = self._launch(cmd, workdir, output_dir, rollout)
        except OSError as exc:  # e.g. E2BIG: a task over Linux's 128 KiB limit for one argument
            result = HarnessResult(rollout.rollout_id, "crashed", reason=f"could not start mini: {exc}")
        else:
            run = classify_run(outcome, trajectory, output_dir, cmd, self._identity, rollout.timeout_s,
                            FINISHED_EXIT_STATUSES)
            result = _as_result(rollout.rollout_id, run, output_dir)
            if rollout.container is not None:
                _attach_container_diff(result, output_dir / DIFF_NAME)
        result.info["launcher"] = "fork" if self._forks and rollout.container is None else "exec"
        self.write_record(output_dir / RESULT_NAME, result, cmd)
        return result

    def _launch(self, cmd: list[str], workdir: Path, output_dir: Path, rollout: HarnessRollout) -> ProcessOutcome:
        """``cmd`` run to its end: forked from the server (``mini`` on the local machine) or exec'd; a local
        rollout's ``mini`` and its commands in the rollout's jail (``harness.isolation``)."""
        if rollout.container is not None:
            return run_in_session(cmd, workdir, self._proc_env, output_dir, rollout.timeout_s, stdin=self._answers)
        env = self._proc_env | dict(rollout.env or {})
        own = [str(self._env.root), *interpreter_paths(str(self._env.python)), str(self._answers)]
        with rollout_jail(self._isolation, rollout, output_dir, env, cmd, own, [self._proc_env["HOME"]],
                          workdir_at=JAIL_WORKDIR) as jail:
            if self._forks is not None:
                spec, cwd = (jail.reusable_spec(), Path(JAIL_WORKDIR)) if jail is not None else (None, workdir)
                return self._forks.run(cmd, cwd, output_dir, rollout.timeout_s, stdin=self._answers, jail=spec)
            return run_in_session(cmd, workdir, self._proc_env, output_dir, rollout.timeout_s, stdin=self._answers,
                                  jail=jail)

    def close(self) -> None:
        """Stop the fork server, then drop the state dir if it was temporary."""
        if self._forks is not None:
            self._forks.close()
        super().close()

    def _container_command(self, rollout: HarnessRollout, config_path: Path, trajectory: Path) -> list[str]:
        """The 1.x docker runner's command line and its request file (the instance as mini's runner reads it)."""
        output_dir = Path(rollout.output_dir).resolve()
        task = rollout.task
        instance = {"instance_id": task.instance_id, "problem_statement": task.problem_statement,
                    "image_name": rollout.container.image}
        request = {"config": str(config_path), "instance": instance, "model_name": litellm_model_name(
            rollout.model_name), "output": str(trajectory), "diff_command": rollout.container.diff_command,
                   "diff_path": str(output_dir / DIFF_NAME)}
        request_path = output_dir / "config" / "repro-mswea-v1-docker-request.json"
        request_path.write_text(json.dumps(request, indent=2) + "\n")
        (output_dir / DIFF_NAME).unlink(missing_ok=True)
        return [str(self._env.python), str(DOCKER_RUNNER), str(request_path)]


def _attach_container_diff(result: HarnessResult, diff_path: Path) -> None:
    """The patch the runner printed inside the container (or why it could not). After a timeout the runner was
    killed before it could remove the container: the sandbox's workspace cleanup removes it, by the rollout's
    label."""
    error_path = Path(f"{diff_path}.error")
    if diff_path.is_file():
        result.info["diff"] = diff_path.read_text(encoding="utf-8")
    elif error_path.is_file():
        result.info["diff_error"] = error_path.read_text(encoding="utf-8")


def _as_result(rollout_id: str, run: HarnessRunResult, output_dir: Path) -> HarnessResult:
    """The contract's result; an error caught by ``mini`` (exit 0) is named with its traceback's last line."""
    info = (trajectory_info(run.trajectory_path) if run.trajectory_path else None) or {}
    traceback = str(info.get("traceback") or "")
    reason = run.reason
    if run.status == "crashed" and run.exit_code == 0 and traceback:
        reason = f"uncaught error, exit status {run.exit_status}: {last_line(traceback)}"
    return HarnessResult(
        rollout_id=rollout_id,
        status=run.status,
        reason=reason,
        exit_status=run.exit_status,
        n_model_calls=run.n_model_calls,
        duration_s=run.duration_s,
        trajectory_path=str(run.trajectory_path) if run.trajectory_path else None,
        info={"cpu_s": run.cpu_s, "exit_code": run.exit_code, "submission": info.get("submission"),
              "error": traceback[-TAIL_CHARS:], "stdout_log": str(output_dir / "stdout.log"),
              "stderr_log": str(output_dir / "stderr.log")},
    )

"""OpenHands (the V1 SDK: ``openhands-sdk`` + ``openhands-tools``, pin 1.58.2) behind the ``Harness`` contract.

``openhands-ai`` is only the web app; what runs headless, unmodified and without Docker is the SDK that OpenHands'
own benchmarks drive. Each rollout is one run of the runner in the harness env's Python (>= 3.12), as if by::

    <env>/bin/python -P harness_adapters/openhands_runner.py <out>/spec.json

with cwd=<workdir>, stdin=/dev/null, its own session, a clean environment (isolated HOME/XDG dirs, dummy API
key, ``LITELLM_LOCAL_MODEL_COST_MAP=True``, no telemetry variables) and its own ``TMUX_TMPDIR``: the terminal tool
starts a tmux server (it daemonizes, so the process group does not hold it); after the run, every server under
that dir is killed with its process tree. See ``openhands_runner`` for what runs inside. ``launcher``: ``fork``
(default) forks it from a server that imported the SDK once, ``exec`` starts that very command
(:mod:`harness_adapters.openhands_launch`); the runner gets the same argv, environment, jail and logs either way.

Jailed by default (``isolation``, :mod:`harness_adapters.isolation`): the runner, its tmux server and every command
see the working copy and output folder (read-write), the env and the runner script (read-only), the per-rollout
``TMUX_TMPDIR`` (read-write, at the same short host path: tmux socket paths max ~107 bytes) and nothing else of the
host; the network reaches only the proxy. The jail's ``/dev`` has ptys of its own (a devpts instance that the jail's
new root mounts, ``jail_init.mount_ptys``: tmux needs them; ``spec["jail"]`` tells the runner it is jailed). The
tmux server lives in the jail's PID namespace and ends with it; the adapter never uses the pid a jailed server
reports (it is the namespace's). A forked runner enters the same jail (the fork server's ``jail``) and is the PID 1
of its namespace; its end ends the namespace's tmux server as the jail's own PID 1 does for an exec'd one.

Findings (1.58.2, read from the installed source and watched through the proxy):

- Wire: LiteLLM 1.105.7 -> OpenAI SDK 2.26.0, non-streaming ``POST <base_url>/chat/completions`` with ``model``,
  ``messages`` (content as lists of text parts; the assistant turn as ``tool_calls`` with ``content: null``),
  ``tools`` (terminal, file_editor, task_tracker, finish, think; ~17 KB of JSON, each with a ``security_risk``
  argument), ``prompt_cache_key`` (the conversation id) and ``reasoning_effort: "high"``; ``max_completion_tokens``
  only when set; ``temperature`` only with ``supports_sampling_params`` (see ``OpenHandsConfig``). System prompt
  ~15 KB, static (no date); the first prompt is ~20.5k tokens of the tiny byte-level tokenizer (the test model
  needs ``max_position_embeddings`` > 8192).
- Ends: a ``finish`` call -> ``finished``; a reply without tool calls also ends the run as finished; the iteration
  cap -> ``MaxIterationsReached`` (status error); the stuck detector (4 identical steps, or 3 empty replies) ->
  ``stuck``; an LLM error after retries -> ``ConversationRunError``. A condensation is one iteration of its own.
- Condenser: the default agent's is ``LLMSummarizingCondenser(max_size=80, keep_first=4)`` on a copy of its LLM.
  It summarizes when the view holds more than ``max_size`` events (system prompt, task, then one action and one
  observation per step), with one call without tools (a system + a user message) and the agent continues from
  system prompt + kept events + summary: the next prompt does not extend the last one. Here its LLM points at the
  proxy's ``summary`` purpose URL, so that call is recorded as ``purpose=summary``.
- Network: nothing but ``base_url`` with the env below (observability is off without ``LMNR_*`` / ``OTEL_*``
  variables; the model-info lookup only queries ``litellm_proxy/`` models; the browser tool is not loaded in CLI
  mode). Start-up: the imports cost ~5 CPU-s a process, paid once per harness by the fork server (~4 s). Scripted
  expert, sequential, 2 cores, CPU-s / wall s a rollout with the model server, proxy and grading: forked 1.0 / 1.7
  jailed, 0.8 / 1.5 unjailed; exec'd 7.4 / 8.0 jailed, 6.6 / 7.5 unjailed.
- The runner lives beside this module, whose name would shadow the SDK's ``openhands`` package: ``python -P``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness_adapters.isolation import check_isolation, resolve_isolation, rollout_jail
from harness_adapters.openhands_launch import LAUNCHERS, RUNNER, RunnerLauncher, build_process_env, kill_tmux_servers
from harness_adapters.per_rollout import PerRolloutHarness
from harness_adapters.processes import TAIL_CHARS, ProcessOutcome, kill_processes_under, last_line, tail
from harness_adapters.versions import nearest
from repro.common.venvs import HarnessEnv, HarnessEnvError, ensure_harness_env
from repro.execution.jail import interpreter_paths
from repro.protocols import HarnessResult, HarnessRollout
from repro.proxy.routes import purpose_base_url

__all__ = ["DEFAULT_VERSION", "NAME", "OpenHandsConfig", "OpenHandsHarness", "build_process_env",
           "ensure_openhands_env", "find_python", "kill_tmux_servers"]

NAME = "openhands"
DEFAULT_VERSION = "1.58.2"
MIN_PYTHON = (3, 12)
# LiteLLM and the OpenAI SDK decide what goes over the wire: pinned with the harness (what 1.58.2 resolves to).
PINNED_PACKAGES: dict[str, list[str]] = {
    "1.58.2": ["openhands-sdk==1.58.2", "openhands-tools==1.58.2", "litellm==1.105.7", "openai==2.26.0"],
}
WIRE_PACKAGES = ("openhands-sdk", "openhands-tools", "litellm", "openai")
DEFAULT_TOOLS = ("terminal", "file_editor", "task_tracker", "finish", "think")  # get_default_agent(cli_mode=True)
ADAPTER_LOG_NAME = "harness_run.json"
RESULT_NAME = "result.json"  # written by the runner
FINISHED_EXIT_STATUSES = ("finished", "max_iterations", "stuck")
# SDK files that render what the model sees (system prompt sections, tool descriptions, condenser prompts),
# relative to site-packages; hashed into the identity with the runner.
PROMPT_FILE_GLOBS = (
    "openhands/sdk/context/prompts/**/*.py", "openhands/sdk/context/prompts/**/*.j2",
    "openhands/sdk/context/condenser/prompts/*.j2", "openhands/sdk/agent/base.py",
    "openhands/sdk/tool/builtins/*.py", "openhands/tools/preset/default.py",
    "openhands/tools/terminal/definition.py", "openhands/tools/terminal/descriptions.py",
    "openhands/tools/file_editor/definition.py", "openhands/tools/task_tracker/definition.py",
)


@dataclass(frozen=True)
class OpenHandsConfig:
    """Harness settings fixed across rollouts (all but ``launcher`` part of the identity).

    ``condenser``: ``summarizing`` (the default agent's ``LLMSummarizingCondenser``; 80 / 4 are its sizes) or
    ``none``; ``condenser_max_tokens``: it also condenses when LiteLLM's count of the view passes this (the SDK's
    ``max_tokens``; for an unknown model name tiktoken's count, not the served tokenizer's).
    ``command_timeout_s``: the terminal tool's no-change timeout (a command silent that long returns to the agent,
    still running); None keeps the default agent's (30 s). ``temperature`` / ``max_tokens`` are
    sent only when set (``max_tokens`` = the SDK's ``max_output_tokens``, sent as ``max_completion_tokens``; a
    temperature needs ``capability_overrides.supports_sampling_params``, set with it, because the SDK drops
    sampling parameters for models it takes for reasoning ones, which an unknown ``openai/`` model is).
    ``num_retries``: the SDK retries a failed call this many times (its default 5, waits of 8-64 s; 0 fails
    fast). ``extra_llm``: other ``openhands.sdk.LLM`` fields, passed as they are. ``isolation``: ``auto`` | ``jail``
    | ``none``, each rollout's runner in a jail (:mod:`harness_adapters.isolation`; the resolved mode is in the
    identity). ``launcher``: ``fork`` | ``exec``, how each runner starts (:mod:`harness_adapters.openhands_launch`;
    not in the identity: the requests are the same)."""

    version: str = DEFAULT_VERSION
    max_iterations: int = 100
    condenser: Literal["summarizing", "none"] = "summarizing"
    condenser_max_size: int = 80
    condenser_keep_first: int = 4
    condenser_max_tokens: int | None = None  # also condense past this many tokens (LiteLLM's count of the view)
    command_timeout_s: int | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    num_retries: int = 0
    request_timeout_s: int = 600
    extra_llm: dict[str, Any] = field(default_factory=dict)
    isolation: str = "auto"  # auto | jail | none: each rollout's runner in a jail (harness_adapters.isolation)
    launcher: str = "fork"  # fork | exec: forked from a fork server that imported the SDK, or a fresh interpreter

    def __post_init__(self) -> None:
        check_isolation(self.isolation)
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {', '.join(LAUNCHERS)}, got {self.launcher!r}")
        if self.condenser not in ("summarizing", "none"):
            raise ValueError(f"condenser must be 'summarizing' or 'none', got {self.condenser!r}")
        if self.max_iterations < 1:
            raise ValueError(f"max_iterations must be >= 1, got {self.max_iterations}")
        if self.condenser == "summarizing" and self.condenser_max_size // 2 - self.condenser_keep_first - 1 <= 0:
            raise ValueError(f"condenser_keep_first ({self.condenser_keep_first}) must be below condenser_max_size "
                             f"// 2 - 1 ({self.condenser_max_size // 2 - 1}): the SDK's LLMSummarizingCondenser "
                             f"refuses it")
        object.__setattr__(self, "extra_llm", _plain(self.extra_llm))  # e.g. Hydra's DictConfig -> JSON-ready
        reserved = {"model", "base_url", "api_key", "usage_id"} & set(self.extra_llm)
        if reserved:
            raise ValueError(f"extra_llm may not set {sorted(reserved)}: the adapter sets them per rollout")

    @property
    def step_limit(self) -> int:
        """The evaluation spec's step limit: OpenHands' ``max_iteration_per_run``."""
        return self.max_iterations

    @property
    def wall_time_limit_s(self) -> int:
        """OpenHands has no wall-time limit of its own (the rollout timeout applies)."""
        return 0

    def llm_fields(self) -> dict[str, Any]:
        """The ``LLM(...)`` fields these settings stand for (besides model, URL and key)."""
        fields: dict[str, Any] = {"num_retries": self.num_retries, "timeout": self.request_timeout_s}
        if self.temperature is not None:  # else dropped: the SDK takes an unknown openai/ model for a reasoning one
            fields |= {"temperature": self.temperature, "capability_overrides": {"supports_sampling_params": True}}
        if self.max_tokens is not None:
            fields["max_output_tokens"] = self.max_tokens
        overrides = {**fields.get("capability_overrides", {}), **self.extra_llm.get("capability_overrides", {})}
        return fields | self.extra_llm | ({"capability_overrides": overrides} if overrides else {})

    def settings(self) -> dict[str, Any]:
        """What the identity records besides files and packages."""
        condenser: dict[str, Any] = {"kind": self.condenser}
        if self.condenser == "summarizing":
            condenser |= {"max_size": self.condenser_max_size, "keep_first": self.condenser_keep_first,
                          "llm": "same model, proxy purpose 'summary'"}
            if self.condenser_max_tokens is not None:
                condenser["max_tokens"] = self.condenser_max_tokens
        return {"agent": "get_default_agent(cli_mode=True)", "tools": list(DEFAULT_TOOLS),
                "max_iterations": self.max_iterations, "condenser": condenser,
                "command_timeout_s": self.command_timeout_s, "llm": self.llm_fields(), "stuck_detection": True}


def _plain(value: Any) -> Any:
    """Mappings and sequences (Hydra containers included) as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    iterable = hasattr(value, "__iter__") and not isinstance(value, (str, bytes))
    return [_plain(v) for v in value] if iterable else value


def find_python(minimum: tuple[int, int] = MIN_PYTHON) -> str:
    """A Python >= ``minimum`` to build the env with: ``python3.N`` on PATH, then pyenv's versions, oldest
    first (3.12 is what the SDK is tested on; the choice is part of the env's build hash, so it must not vary)."""
    candidates = [shutil.which(f"python3.{minor}") for minor in range(minimum[1], 15)]
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    if pyenv.is_dir():
        candidates += [str(p / "bin" / "python3") for p in sorted(pyenv.iterdir(), key=_version_key)]
    for candidate in filter(None, candidates):
        found = _python_at_least(candidate, minimum)
        if found:
            return found
    raise HarnessEnvError(
        f"OpenHands (openhands-sdk) needs Python >= {minimum[0]}.{minimum[1]} and none was found (looked for "
        f"python3.12..python3.14 on PATH and {pyenv}/*/bin/python3). Install one, e.g. `pyenv install 3.12` or "
        f"`apt-get install python3.12 python3.12-venv`, or pass python=<path>")


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(x) if x.isdigit() else 0 for x in path.name.split("."))


def _python_at_least(executable: str, minimum: tuple[int, int]) -> str | None:
    """The real executable behind ``executable`` (pyenv shims resolve) if it runs and is >= ``minimum``."""
    code = "import sys; print(sys.executable); print(*sys.version_info[:2])"
    try:
        out = subprocess.run([executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
        path, version = out.stdout.strip().splitlines()[-2:]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    major, minor = (int(x) for x in version.split())
    return path if (major, minor) >= minimum else None


def ensure_openhands_env(version: str = DEFAULT_VERSION, python: str | None = None) -> HarnessEnv:
    """The cached env for OpenHands ``version`` (built on first use: ~55-100 s, ~680 MB); a version that is not
    on PyPI fails naming it and the nearest releases."""
    packages = PINNED_PACKAGES.get(version, [f"openhands-sdk=={version}", f"openhands-tools=={version}"])
    try:
        return ensure_harness_env(NAME, version, packages, python=python or find_python())
    except HarnessEnvError as exc:
        missing = missing_version_message(str(exc), version)
        if missing:
            raise HarnessEnvError(missing) from exc
        raise HarnessEnvError(f"could not install OpenHands {version}: {exc}") from exc


def missing_version_message(pip_output: str, version: str) -> str | None:
    """A clear message when pip found no ``openhands-sdk`` / ``-tools`` == ``version`` (None otherwise)."""
    for package in ("openhands-sdk", "openhands-tools"):
        match = re.search(rf"satisf(?:y|ies) the requirement {package}=={re.escape(version)} \(from versions: "
                          rf"([^)]*)\)", pip_output)
        if match or f"No matching distribution found for {package}=={version}" in pip_output:
            releases = [v.strip() for v in match.group(1).split(",") if v.strip()] if match else []
            near = nearest(version, frozenset(releases))
            return (f"OpenHands {version} does not exist: PyPI has no {package}=={version} for this Python; "
                    f"nearest releases: {', '.join(near) or 'none listed by pip'}")
    return None


class OpenHandsHarness(PerRolloutHarness):
    """OpenHands' default agent: each rollout one runner process, up to ``concurrency`` at once (threads).

    ``python``: the interpreter (>= 3.12) to build the env with; default :func:`find_python`. Every rollout's state
    lives in its output dir; the fork server's HOME and log in a temporary state dir (made on the first forked run,
    removed by :meth:`close`)."""

    name = NAME
    thread_prefix = "openhands"
    cfg: OpenHandsConfig

    def __init__(self, cfg: OpenHandsConfig | None = None, workers: int = 1, *, env: HarnessEnv | None = None,
                 python: str | None = None) -> None:
        self.cfg = cfg or OpenHandsConfig()
        self._env = env or ensure_openhands_env(self.cfg.version, python)
        self.version = self._env.version_of("openhands-sdk") or self.cfg.version
        self._identity = {
            "name": NAME, "version": self.version, "files_sha256": identity_files(self._env),
            "packages": {p: self._env.version_of(p) or "" for p in WIRE_PACKAGES},
            "settings": self.cfg.settings() | {"isolation": resolve_isolation(self.cfg.isolation)},
        }
        self._state_lock = threading.Lock()
        self._launcher = RunnerLauncher(self.cfg.launcher, self._env.python, self._state_dir)

    def identity(self) -> dict[str, Any]:
        """Name, SDK version, sha256 of the runner and of the SDK files that render what the model sees,
        wire-relevant package versions, settings (condenser, iterations, tools, LLM fields, resolved isolation)."""
        return json.loads(json.dumps(self._identity))

    def rollout_spec(self, rollout: HarnessRollout, *, jailed: bool = False) -> dict[str, Any]:
        """The runner's spec for ``rollout`` (no secrets: the key travels in the environment); ``jailed``: the runner
        runs in a jail (whose root has ptys of its own for tmux)."""
        cfg = self.cfg
        condenser = {"kind": cfg.condenser, "max_size": cfg.condenser_max_size, "keep_first": cfg.condenser_keep_first,
                     "max_tokens": cfg.condenser_max_tokens}
        terminal = {} if cfg.command_timeout_s is None else {"no_change_timeout_seconds": cfg.command_timeout_s}
        return {
            "task": rollout.task.problem_statement, "workdir": str(Path(rollout.workdir).resolve()),
            "output_dir": str(Path(rollout.output_dir).resolve()), "model": f"openai/{rollout.model_name}",
            "base_url": rollout.base_url, "summary_base_url": purpose_base_url(rollout.base_url, "summary"),
            "max_iterations": cfg.max_iterations, "condenser": condenser, "llm": cfg.llm_fields(),
            "terminal": terminal, "jail": jailed,
        }

    def run_one(self, rollout: HarnessRollout) -> HarnessResult:
        """One runner process for ``rollout``, forked or exec'd (jailed unless ``isolation`` resolves to none; its
        tmux servers killed after it); its record in ``output_dir``."""
        workdir, output_dir = Path(rollout.workdir).resolve(), Path(rollout.output_dir).resolve()
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / RESULT_NAME).unlink(missing_ok=True)
        spec_path = output_dir / "spec.json"
        cmd = [str(self._env.python), "-P", str(RUNNER), str(spec_path)]  # -P: its dir holds openhands.py
        tmux_dir = Path(tempfile.mkdtemp(prefix="oh-tmux-", dir="/tmp"))  # short: tmux socket paths max ~107 bytes
        jailed = False
        try:
            env = build_process_env(home=output_dir / "home", tmux_tmpdir=tmux_dir)
            with rollout_jail(self.cfg.isolation, rollout, output_dir, env, cmd, self.read_only(),
                              read_write=[str(tmux_dir)]) as jail:
                jailed = jail is not None
                spec = self.rollout_spec(rollout, jailed=jailed)
                spec_path.write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
                outcome = self._launcher.run(cmd, workdir, env, output_dir, rollout.timeout_s, jail)
        finally:
            killed = kill_tmux_servers(tmux_dir, jailed=jailed)
            shutil.rmtree(tmux_dir, ignore_errors=True)
        if outcome.timed_out or outcome.exit_code != 0:
            kill_processes_under([workdir])  # commands that left the tmux server's tree
        result = as_result(rollout.rollout_id, outcome, output_dir, rollout.timeout_s)
        result.info |= {"tmux_servers_killed": killed, "isolation": "jail" if jailed else "none",
                        "launcher": self.cfg.launcher}
        self.write_record(output_dir / ADAPTER_LOG_NAME, result, cmd)
        return result

    def read_only(self) -> list[str]:
        """What the jailed runner reads besides the system's directories: the env (its interpreter and packages)
        and its base installation; the runner script comes with the command."""
        return [str(self._env.root), *interpreter_paths(str(self._env.python))]

    def _state_dir(self) -> Path:
        """A temporary state dir for the fork server (made once, on first use)."""
        with self._state_lock:
            return self._state if self._state is not None else self.use_state_dir(None, "repro-openhands-")

    def close(self) -> None:
        """Stop the fork server, then drop its state dir."""
        self._launcher.close()
        super().close()


def identity_files(env: HarnessEnv) -> dict[str, str]:
    """sha256 of the runner and of every SDK file in ``PROMPT_FILE_GLOBS`` (keys: paths in site-packages)."""
    site = env.site_packages
    files = {RUNNER.name: _sha256(RUNNER)}
    for pattern in PROMPT_FILE_GLOBS:
        for path in sorted(site.glob(pattern)):
            if "__pycache__" not in path.parts:
                files[path.relative_to(site).as_posix()] = _sha256(path)
    return dict(sorted(files.items()))


def read_result(output_dir: Path) -> dict[str, Any] | None:
    """The runner's result JSON (None when it wrote none)."""
    try:
        return json.loads((output_dir / RESULT_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def as_result(rollout_id: str, outcome: ProcessOutcome, output_dir: Path, timeout_s: float) -> HarnessResult:
    """The contract's result from the runner's exit and result JSON: finished iff it ended by its own rule."""
    result = read_result(output_dir) or {}
    exit_status = str(result.get("exit_status") or "")
    calls = {str(k): int(v) for k, v in (result.get("n_llm_calls") or {}).items()}
    if outcome.timed_out:
        status, reason = "timeout", f"killed after {timeout_s:g} s"
    elif not result:
        status = "crashed"
        reason = f"runner exit code {outcome.exit_code}, no result: {last_line(tail(output_dir / 'stderr.log'))}"
    elif exit_status in FINISHED_EXIT_STATUSES:
        status, reason = "finished", exit_status
    else:
        status = "crashed"
        error = str(result.get("error") or "").strip().splitlines()
        reason = f"exit status {exit_status or 'none'}: {error[0] if error else 'no error recorded'}"
    events = output_dir / "events.jsonl"
    return HarnessResult(
        rollout_id=rollout_id, status=status, reason=reason, exit_status=exit_status,
        n_model_calls=sum(calls.values()), duration_s=round(outcome.duration_s, 3),
        trajectory_path=str(events) if events.exists() else None,
        info={"cpu_s": round(outcome.cpu_s, 3), "exit_code": outcome.exit_code, "calls_by_usage": calls,
              "execution_status": result.get("execution_status"), "conversation_id": result.get("conversation_id"),
              "persistence_dir": result.get("persistence_dir"),
              "error": str(result.get("traceback") or "")[-TAIL_CHARS:],
              "stdout_log": str(output_dir / "stdout.log"), "stderr_log": str(output_dir / "stderr.log")},
    )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()

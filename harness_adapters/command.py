"""Any agent as a harness: a command template run once per rollout in the task's working copy (``harness=command``).

The agent gets the task, the working directory and a model endpoint; what it does with them is its own business.
The command and the values of ``env`` are templates (Python's ``str.format``: a literal brace is doubled) with these
fields:

- ``{task_file}``: a file holding the task text; ``{task}``: the text itself (one argv element, never through a shell)
- ``{workdir}``: the working copy (also the process's cwd); ``{output_dir}``: the rollout's folder; ``{home}``: its
  private HOME
- ``{base_url}``: the rollout's proxy URL for the configured ``api``: ``.../rollouts/<id>/v1`` for ``chat`` and
  ``responses`` (what OpenAI clients take), ``.../rollouts/<id>`` for ``messages`` (Anthropic clients add ``/v1``);
  ``{openai_base_url}`` and ``{anthropic_base_url}`` are both forms
- ``{model}``: the served model's name; ``{launch_dir}``: the directory ``repro run`` was started from (for an
  agent script given by a path relative to it)

Every process also gets ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY`` (dummy
keys: the proxy holds the real one, if any), ``REPRO_MODEL``, ``REPRO_TASK_FILE``, a private ``HOME`` with its XDG
dirs, and only ``PATH``/locale from the parent. stdin is ``/dev/null``. Exit 0 is ``finished``; another exit code
``crashed`` (with stderr's last line), unless the model's last reply was cut at the token limit and every call was
answered (the agent gave up on the model's output: ``finished``); past the rollout's time ``timeout`` (its whole
process tree is killed).
The graded patch is the working copy's diff, as for every harness; the model calls are counted by the proxy.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from harness_adapters.isolation import check_isolation, resolve_isolation, rollout_jail
from harness_adapters.per_rollout import PerRolloutHarness
from harness_adapters.processes import DUMMY_API_KEY, isolated_env, last_line, run_in_session, tail
from repro.common.secrets import REDACTED, without_secrets
from repro.protocols import HarnessResult, HarnessRollout

NAME = "command"
APIS = ("chat", "responses", "messages")
RESULT_NAME = "command_result.json"
_FIELDS = ("task_file", "task", "workdir", "output_dir", "home", "base_url", "openai_base_url",
           "anthropic_base_url", "model", "launch_dir")


@dataclass
class CommandConfig:
    """An agent given as a command (``repro/conf/harness/command.yaml``)."""

    command: list[str] | str = field(default_factory=list)  # argv template (a string is split like a shell would)
    api: str = "chat"  # chat | responses | messages: the API the agent speaks (picks {base_url})
    env: dict[str, str] = field(default_factory=dict)  # more variables (templates), e.g. the agent's own settings
    label: str = "command"  # the agent's name in records and tables
    agent_version: str = ""  # the agent's own version, recorded in the frozen spec
    model_name: str | None = None  # None: the served model's name
    step_limit: int = 0  # recorded in the frozen spec; the agent enforces its own limits
    wall_time_limit_s: float = 0
    isolation: str = "auto"  # auto | jail | none: each rollout in a jail (harness_adapters.isolation)
    read_only: list[str] = field(default_factory=list)  # more paths the jailed agent may read

    def __post_init__(self) -> None:
        if isinstance(self.command, str):
            self.command = shlex.split(self.command)
        self.command = [str(part) for part in self.command]
        if not self.command:
            raise ValueError("harness=command needs harness.command: the agent's argv, e.g. "
                             "['python', 'my_agent.py', '--task-file', '{task_file}', '--base-url', '{base_url}']")
        if self.api not in APIS:
            raise ValueError(f"harness.api must be one of {', '.join(APIS)}, got {self.api!r}")
        for template in [*self.command, *self.env.values()]:
            check_template(str(template))
        check_isolation(self.isolation)


def check_template(template: str) -> None:
    """A template naming a field that does not exist fails now, naming the fields there are."""
    try:
        template.format(**dict.fromkeys(_FIELDS, ""))
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"harness template {template!r} is not valid ({type(exc).__name__}: {exc}); "
                         f"its fields are {', '.join('{' + f + '}' for f in _FIELDS)}; "
                         "a literal brace is written {{ or }}") from None


def rollout_fields(rollout: HarnessRollout, api: str, model: str, task_file: Path, home: Path,
                   launch_dir: Path) -> dict[str, str]:
    """The template fields of one rollout."""
    openai_base = rollout.base_url.rstrip("/")
    anthropic_base = openai_base.removesuffix("/v1")
    return {"task_file": str(task_file), "task": rollout.task.problem_statement,
            "workdir": str(Path(rollout.workdir).resolve()), "output_dir": str(Path(rollout.output_dir).resolve()),
            "home": str(home), "base_url": anthropic_base if api == "messages" else openai_base,
            "openai_base_url": openai_base, "anthropic_base_url": anthropic_base, "model": model,
            "launch_dir": str(launch_dir)}


def process_env(cfg: CommandConfig, values: dict[str, str], home: Path, rollout_env: dict[str, str]) -> dict[str, str]:
    """The agent's environment: isolated, the endpoint variables, the sandbox's command env, the configured env."""
    env = isolated_env(home) | rollout_env
    env |= {"OPENAI_BASE_URL": values["openai_base_url"], "OPENAI_API_KEY": DUMMY_API_KEY,
            "ANTHROPIC_BASE_URL": values["anthropic_base_url"], "ANTHROPIC_API_KEY": DUMMY_API_KEY,
            "REPRO_MODEL": values["model"], "REPRO_TASK_FILE": values["task_file"]}
    return env | {key: str(value).format(**values) for key, value in cfg.env.items()}


def proxy_rollout_info(base_url: str) -> dict[str, Any]:
    """How the rollout's calls ended, as the proxy knows it (its ``call_outcomes`` route, opened by the rollout's own
    base URL); empty when it cannot say."""
    rollout_url = base_url.rstrip("/").removesuffix("/v1")
    try:
        info = httpx.get(f"{rollout_url}/call_outcomes", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def gave_up_after_truncation(info: dict[str, Any]) -> bool:
    """The agent stopped after the model's last reply hit the token limit, every call having been answered: the
    model's doing, not the machinery's (Claude Code and Codex exit 1 when a reply is cut again and again)."""
    outcomes = info.get("call_outcomes") or {}
    failed = {k: v for k, v in (outcomes.get("by_status") or {}).items() if k in ("error", "aborted")}
    return outcomes.get("last_status") == "truncated" and not failed


class CommandHarness(PerRolloutHarness):
    """Each rollout one process of the configured command, up to ``concurrency`` at once."""

    name = NAME
    thread_prefix = "command"
    cfg: CommandConfig

    def __init__(self, cfg: CommandConfig | None = None, workers: int = 1) -> None:
        self.cfg = cfg or CommandConfig()
        self.version = self.cfg.agent_version or "unversioned"
        self.launch_dir = Path.cwd()

    def identity(self) -> dict[str, Any]:
        """The label, version, API, command and env templates (and their hash): what defines the agent here."""
        env = without_secrets(dict(sorted(self.cfg.env.items())), REDACTED)  # the spec is published: no keys
        settings = {"command": self.cfg.command, "api": self.cfg.api, "env": env,
                    "model_name": self.cfg.model_name or "{served_model_name}", "step_limit": self.cfg.step_limit,
                    "isolation": resolve_isolation(self.cfg.isolation)}
        digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
        return {"name": NAME, "label": self.cfg.label, "version": self.version, "settings": settings,
                "files_sha256": {"settings": digest}, "packages": {}}

    def run_one(self, rollout: HarnessRollout) -> HarnessResult:
        """One run of the command for ``rollout``; its record in ``output_dir``."""
        out = Path(rollout.output_dir).resolve()
        out.mkdir(parents=True, exist_ok=True)
        home, task_file = out / "home", out / "task.txt"
        task_file.write_text(rollout.task.problem_statement, encoding="utf-8")
        values = rollout_fields(rollout, self.cfg.api, self.cfg.model_name or rollout.model_name, task_file, home,
                                self.launch_dir)
        cmd = [part.format(**values) for part in self.cfg.command]
        env = process_env(self.cfg, values, home, rollout.env)
        with rollout_jail(self.cfg.isolation, rollout, out, env, cmd, self.cfg.read_only) as jail:
            result = run_command(rollout, cmd, env, out, self.cfg.label, jail=jail)
        self.write_record(out / RESULT_NAME, result, cmd)
        return result


def run_command(rollout: HarnessRollout, cmd: list[str], env: dict[str, str], out: Path, label: str,
                describe: Callable[[Path], str | None] | None = None, jail: Any = None) -> HarnessResult:
    """Run one agent process in the rollout's working copy and classify how it ended: exit 0 ``finished``; past its
    time ``timeout``; another exit ``crashed``, unless the agent gave up after a reply cut at the token limit
    (:func:`gave_up_after_truncation`: ``finished``). ``describe(out)``: the agent's own account of a failure."""
    try:
        outcome = run_in_session(cmd, Path(rollout.workdir).resolve(), env, out, rollout.timeout_s, jail=jail)
    except OSError as exc:
        return HarnessResult(rollout.rollout_id, "crashed", reason=f"could not start {label}: {exc}")
    info = proxy_rollout_info(rollout.base_url)
    account = (describe(out) if describe else None) or last_line(tail(out / "stderr.log"))
    if outcome.timed_out:
        status, reason = "timeout", f"killed after {rollout.timeout_s:g} s"
    elif outcome.exit_code == 0:
        status, reason = "finished", "exit 0"
    elif gave_up_after_truncation(info):
        status, reason = "finished", f"exit code {outcome.exit_code} after a reply cut at the token limit: {account}"
    else:
        status, reason = "crashed", f"exit code {outcome.exit_code}: {account}"
    return HarnessResult(
        rollout_id=rollout.rollout_id, status=status, reason=reason, exit_status=str(outcome.exit_code),
        n_model_calls=int(info.get("calls") or 0), duration_s=round(outcome.duration_s, 3),
        info={"cpu_s": round(outcome.cpu_s, 3), "exit_code": outcome.exit_code,
              "call_outcomes": info.get("call_outcomes"), "stdout_log": str(out / "stdout.log"),
              "stderr_log": str(out / "stderr.log"), "stderr_tail": tail(out / "stderr.log", 500)},
    )

"""OpenCode (npm ``opencode-ai``, pinned 1.18.33) behind the ``Harness`` contract: one ``opencode run`` per rollout.

Invocation (``harness_adapters.opencode_env`` installs it)::

    <env>/npm/node_modules/.bin/opencode run -m repro/<model> --agent build --auto --format json
        --print-logs --log-level INFO          < <out>/task.txt

run with cwd=<workdir>, its own session, and a clean environment: ``HOME`` and ``XDG_{CONFIG,DATA,CACHE,STATE}_HOME``
inside ``<out>/home``, ``OPENCODE_CONFIG=<out>/config/opencode.json``, ripgrep first on PATH, and
``OPENCODE_DISABLE_*`` for the models.dev fetch, autoupdate, LSP downloads, default plugins and project config.

Findings from running 1.18.33 against a stub (requests, ``strace -e connect``) and reading its bundled JS:

- Task: positional message words are joined with quotes added around words holding spaces; stdin that is not a
  TTY is read whole and is the message when no word is given. So the task goes through stdin: its exact bytes,
  without argv's 128 KiB limit.
- Wire: **always streams** (``stream: true``, ``stream_options.include_usage``); body ``{model, max_tokens
  (= the model's limit.output), messages, tools (bash, edit, glob, grep, read, skill, task, todowrite, webfetch,
  write), tool_choice: auto}``; headers ``user-agent: opencode/1.18.33 ai-sdk/provider-utils/4.0.23
  runtime/bun/1.3.14``, ``x-session-id`` / ``x-session-affinity`` (the OpenCode session id). OpenCode picks its
  system prompt by substrings of the model id (not checked here which ones), hence ``model_name``. History: a
  past tool call goes back as ``JSON.stringify`` of the parsed input (``{"a":1}``, while the model may have
  sampled ``{"a": 1}``) and ``content: ""`` when there was no text, so the next prompt need not extend the last.
- Title: the ``title`` agent asks ``small_model`` for a title (no tools; system "You are a title generator...",
  the task as a user message), concurrently with the first step. ``small_model`` is a second provider entry
  (``repro-aux``, same model id) whose baseURL is the proxy's purpose route, so the call is recorded with purpose
  ``auxiliary``; ``train_title: true`` sends it to the policy route instead. A failed title is not fatal.
- Network: the only connections are to the configured baseURLs once (a) the config dir already holds the dependency
  OpenCode would otherwise ``npm install`` into it (``@opencode-ai/plugin``, see ``opencode_env``) and (b) ``rg`` is
  on PATH (else it downloads ripgrep from GitHub). The openai-compatible provider is bundled in the binary.
- Retries: a failed call is retried by the session (connection errors, 5xx, 429) 5 times with exponential backoff
  from 2 s (cap 30 s): a dead endpoint ends after ~68 s with an ``error`` event and exit code 1 (``crashed``).
- Steps: ``agent.<name>.steps`` (``step_limit``) is advisory. Once reached, each request ends with an assistant
  message "CRITICAL - MAXIMUM STEPS REACHED ... Respond with text ONLY" but still offers the tools (tool_choice
  auto): a model that keeps calling tools keeps running, until compaction or the rollout timeout.
- Compaction: when the tokens reported for the last call reach ``limit.context`` minus a reserve, the
  ``compaction`` agent asks the model for a summary (system "You are a context summarization agent", no tools)
  and the session goes on from it ("Continue if you have next steps...") -- a prefix break. ``agent.compaction.
  model`` points it at a third provider entry (``repro-summary``) on the purpose route ``summary``
  (``train_compaction: true``: the policy route).
- The JSON event stream (stdout) has ``step_start`` / ``text`` / ``tool_use`` / ``step_finish`` / ``error`` events
  and the session id; ``opencode export <session>`` prints the stored session (the trajectory, ``<out>/session.json``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness_adapters.isolation import check_isolation, resolve_isolation, rollout_jail
from harness_adapters.merge import merge_configs
from harness_adapters.opencode_env import OpenCodeEnv, ensure_opencode_env
from harness_adapters.opencode_outcome import SESSION_NAME, classify, classify_served, parse_events
from harness_adapters.opencode_serve import OpenCodeServer, ServerPool
from harness_adapters.per_rollout import PerRolloutHarness
from harness_adapters.processes import (
    DUMMY_API_KEY,
    run_in_session,
)
from repro.protocols import HarnessResult, HarnessRollout
from repro.proxy.routes import purpose_base_url

__all__ = ["DEFAULT_VERSION", "OpenCodeConfig", "OpenCodeHarness", "build_command", "opencode_config",
           "parse_events", "route_urls"]

NAME = "opencode"
DEFAULT_VERSION = "1.18.33"
PROVIDER = "repro"
AUX_PROVIDER = "repro-aux"
SUMMARY_PROVIDER = "repro-summary"
PROVIDER_NPM = "@ai-sdk/openai-compatible"
CONFIG_NAME = "opencode.json"
LAUNCHERS = ("run", "serve")
RESULT_NAME = "harness_run.json"
PASSTHROUGH_ENV = ("LANG", "LC_ALL", "LC_CTYPE", "TZ")
DISABLED = {  # env flags of 1.18.33 (names read from its binary): no calls out, nothing picked up from the machine
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",
}


@dataclass(frozen=True)
class OpenCodeConfig:
    """OpenCode settings that stay fixed across rollouts (part of the harness identity, except ``launcher``).

    ``model_name``: the model id OpenCode is given (it picks OpenCode's system prompt and is sent as ``model``;
    None = the rollout's served model name). ``step_limit``: the agent's ``steps`` (0 = OpenCode's default, none).
    ``context_limit`` / ``output_limit``: the model's ``limit`` (``max_tokens`` = ``output_limit``; compaction
    threshold). ``wall_time_limit_s`` is not an OpenCode setting: it is the evaluation's time limit (0 = default).
    ``train_title`` / ``train_compaction``: send the title request / the compaction summary to the policy route
    (default: recorded as ``auxiliary`` / ``summary``; ``samples.train_purposes``, by default ``policy`` and
    ``summary``, decides which are trained: the summary is, the title is not). ``extra_config`` is merged last into
    ``opencode.json``. ``launcher``: ``run`` (one ``opencode run`` a rollout, jailed or not) or ``serve`` (one
    ``opencode serve`` per concurrent rollout, a session a rollout: :mod:`harness_adapters.opencode_serve`;
    ``isolation=none`` only); the model sees the same either way."""

    version: str = DEFAULT_VERSION
    model_name: str | None = None
    agent: str = "build"
    step_limit: int = 0
    wall_time_limit_s: int = 0
    context_limit: int = 32768
    output_limit: int = 4096
    compaction_auto: bool = True
    compaction_prune: bool = False
    compaction_reserved: int | None = None
    train_title: bool = False
    train_compaction: bool = False
    project_config: bool = False
    export_session: bool = True
    extra_config: dict[str, Any] = field(default_factory=dict)
    isolation: str = "auto"  # auto | jail | none: each rollout in a jail (harness_adapters.isolation)
    launcher: str = "run"  # run: one `opencode run` a rollout; serve: one `opencode serve` a slot (not identity)

    def __post_init__(self) -> None:
        if self.step_limit < 0 or self.context_limit < 1 or self.output_limit < 1:
            raise ValueError("step_limit must be >= 0, context_limit and output_limit >= 1")
        check_isolation(self.isolation)
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {', '.join(LAUNCHERS)}, got {self.launcher!r}")


def route_urls(base_url: str) -> dict[str, str]:
    """The rollout's proxy routes by call purpose: ``policy`` (its base URL), ``auxiliary``, ``summary``."""
    return {"policy": base_url, "auxiliary": purpose_base_url(base_url, "auxiliary"),
            "summary": purpose_base_url(base_url, "summary")}


def opencode_config(cfg: OpenCodeConfig, model: str, urls: dict[str, str]) -> dict[str, Any]:
    """The ``opencode.json`` of one rollout: a provider entry per proxy route used (same model id), the title
    request (``small_model``) and the compaction agent routed to theirs, limits, disabled features."""
    entry = {"name": model, "limit": {"context": cfg.context_limit, "output": cfg.output_limit}}
    routes = {PROVIDER: "policy", AUX_PROVIDER: "policy" if cfg.train_title else "auxiliary",
              SUMMARY_PROVIDER: "policy" if cfg.train_compaction else "summary"}
    providers = {name: {"npm": PROVIDER_NPM, "name": name, "options": {"baseURL": urls[route],
                                                                       "apiKey": DUMMY_API_KEY},
                        "models": {model: entry}}
                 for name, route in routes.items() if name == PROVIDER or route != "policy"}
    compaction: dict[str, Any] = {"auto": cfg.compaction_auto, "prune": cfg.compaction_prune}
    if cfg.compaction_reserved is not None:
        compaction["reserved"] = cfg.compaction_reserved
    agents: dict[str, Any] = {}
    if SUMMARY_PROVIDER in providers:
        agents["compaction"] = {"model": f"{SUMMARY_PROVIDER}/{model}"}
    if cfg.step_limit:
        agents[cfg.agent] = {"steps": cfg.step_limit}
    config: dict[str, Any] = {
        "provider": providers,
        "model": f"{PROVIDER}/{model}",
        "small_model": f"{AUX_PROVIDER if AUX_PROVIDER in providers else PROVIDER}/{model}",
        "autoupdate": False,
        "share": "disabled",
        "compaction": compaction,
    }
    if agents:
        config["agent"] = agents
    return merge_configs(config, cfg.extra_config)


def build_command(env: OpenCodeEnv, model: str, agent: str) -> list[str]:
    """The exact ``opencode run`` command line (the task comes on stdin)."""
    return [str(env.binary), "run", "-m", f"{PROVIDER}/{model}", "--agent", agent, "--auto", "--format", "json",
            "--print-logs", "--log-level", "INFO"]


def serve_command(env: OpenCodeEnv) -> list[str]:
    """``opencode serve`` with the logs ``opencode run`` prints (the port and host are added at start)."""
    return [str(env.binary), "serve", "--print-logs", "--log-level", "INFO"]


def build_process_env(env: OpenCodeEnv, cfg: OpenCodeConfig, home: Path, config_path: Path) -> dict[str, str]:
    """A clean environment: locale from the parent, ripgrep first on PATH, isolated HOME/XDG dirs, no secrets."""
    proc_env = {key: os.environ[key] for key in PASSTHROUGH_ENV if key in os.environ}
    proc_env["PATH"] = f"{env.bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
    proc_env |= {"HOME": str(home), **{k: str(v) for k, v in xdg_dirs(home).items()}, **DISABLED,
                 "OPENCODE_CONFIG": str(config_path), "NO_COLOR": "1", "TERM": "dumb"}
    if not cfg.project_config:
        proc_env["OPENCODE_DISABLE_PROJECT_CONFIG"] = "1"
    return proc_env


def xdg_dirs(home: Path) -> dict[str, Path]:
    """The XDG base dirs of an isolated ``home``."""
    return {"XDG_CONFIG_HOME": home / ".config", "XDG_DATA_HOME": home / ".local" / "share",
            "XDG_CACHE_HOME": home / ".cache", "XDG_STATE_HOME": home / ".local" / "state"}


def prepare_home(env: OpenCodeEnv, home: Path) -> None:
    """Make ``home`` and its XDG dirs; give OpenCode's config dir the dependency it would install (no npm run)."""
    for path in xdg_dirs(home).values():
        path.mkdir(parents=True, exist_ok=True)
    config_dir = xdg_dirs(home)["XDG_CONFIG_HOME"] / "opencode"
    config_dir.mkdir(exist_ok=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(env.config_deps / name, config_dir / name)
    link = config_dir / "node_modules"
    if not link.is_symlink():
        link.symlink_to(env.config_deps / "node_modules", target_is_directory=True)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _json_bytes(data: Any) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


class OpenCodeHarness(PerRolloutHarness):
    """OpenCode: each rollout one ``opencode run`` subprocess, up to ``concurrency`` at once (threads)."""

    name = NAME
    thread_prefix = "opencode"
    cfg: OpenCodeConfig
    _servers: ServerPool | None = None

    def __init__(self, cfg: OpenCodeConfig | None = None, workers: int = 1, *, env: OpenCodeEnv | None = None,
                 state_dir: Path | None = None) -> None:
        self.cfg = cfg or OpenCodeConfig()
        self._env = env or ensure_opencode_env(self.cfg.version)
        self.version = self.cfg.version
        state = self.use_state_dir(state_dir, "repro-opencode-")
        self._identity = self._build_identity(state)
        self._servers = self._server_pool(state) if self.cfg.launcher == "serve" else None

    def _server_pool(self, state: Path) -> ServerPool:
        """The ``opencode serve`` pool (``launcher=serve``): refused when rollouts would be jailed."""
        if self._identity["settings"]["isolation"] != "none":
            raise ValueError("harness.launcher=serve runs every rollout's tools inside one shared OpenCode server, "
                             "which cannot be jailed per rollout: set harness.isolation=none (the agent can then "
                             "read this machine's files) or keep harness.launcher=run")

        def make(i: int) -> OpenCodeServer:
            folder = state / f"serve-{i}"
            prepare_home(self._env, folder / "home")
            config_path = folder / CONFIG_NAME
            return OpenCodeServer(serve_command(self._env), build_process_env(self._env, self.cfg, folder / "home",
                                                                              config_path), folder, config_path)
        return ServerPool(make)

    def close(self) -> None:
        """Stop the servers (``launcher=serve``), then drop the state dir if it was temporary."""
        if self._servers is not None:
            self._servers.close()
        super().close()

    def identity(self) -> dict[str, Any]:
        """Name, version, hashes of the generated config (rollout URLs as placeholders), packages, settings."""
        return json.loads(json.dumps(self._identity))

    def _build_identity(self, state: Path) -> dict[str, Any]:
        model = self.cfg.model_name or "{served_model_name}"
        placeholders = {"policy": "{base_url}", "auxiliary": "{base_url:purpose=auxiliary}",
                        "summary": "{base_url:purpose=summary}"}
        template = opencode_config(self.cfg, model, placeholders)
        (state / CONFIG_NAME).write_bytes(_json_bytes(template))
        lock = (self._env.config_deps / "package-lock.json").read_bytes()
        settings = {
            "model_name": model, "agent": self.cfg.agent, "step_limit": self.cfg.step_limit,
            "limit": {"context": self.cfg.context_limit, "output": self.cfg.output_limit},
            "compaction": template["compaction"], "title": "policy" if self.cfg.train_title else "auxiliary",
            "compaction_call": "policy" if self.cfg.train_compaction else "summary",
            "project_config": self.cfg.project_config, "env": dict(DISABLED), "provider_npm": PROVIDER_NPM,
            "extra_config": self.cfg.extra_config, "command": build_command(self._env, model, self.cfg.agent)[1:],
            "isolation": resolve_isolation(self.cfg.isolation),
        }
        return {"name": NAME, "version": self.version,
                "files_sha256": {CONFIG_NAME: _sha256(_json_bytes(template)), "config-deps/package-lock.json":
                                 _sha256(lock)},
                "packages": self._env.packages(), "settings": settings}

    def run_one(self, rollout: HarnessRollout) -> HarnessResult:
        """One rollout: ``opencode run`` (then ``opencode export``), or a session on a server of the pool; its record
        in ``output_dir``."""
        workdir, out = Path(rollout.workdir).resolve(), Path(rollout.output_dir).resolve()
        model = self.cfg.model_name or rollout.model_name
        config = _json_bytes(opencode_config(self.cfg, model, route_urls(rollout.base_url)))
        config_path = out / "config" / CONFIG_NAME
        config_path.parent.mkdir(parents=True, exist_ok=True)
        config_path.write_bytes(config)
        if self._servers is not None:
            result = self._run_served(rollout, workdir, out, model, config)
            self.write_record(out / RESULT_NAME, result, [*serve_command(self._env), "(session)"])
            return result
        home, task_path = out / "home", out / "task.txt"
        prepare_home(self._env, home)
        task_path.write_text(rollout.task.problem_statement, encoding="utf-8")
        cmd = build_command(self._env, model, self.cfg.agent)
        proc_env = build_process_env(self._env, self.cfg, home, config_path)
        try:
            with rollout_jail(self.cfg.isolation, rollout, out, proc_env, cmd, [str(self._env.root)]) as jail:
                outcome = run_in_session(cmd, workdir, proc_env, out, rollout.timeout_s, stdin=task_path, jail=jail)
        except OSError as exc:
            result = HarnessResult(rollout.rollout_id, "crashed", reason=f"could not start opencode: {exc}")
        else:
            events = parse_events((out / "stdout.log").read_text(encoding="utf-8", errors="replace"))
            session = self._export(events, workdir, proc_env, out) if self.cfg.export_session else None
            result = classify(rollout, outcome, events, out, session)
        result.info["launcher"] = "run"
        self.write_record(out / RESULT_NAME, result, cmd)
        return result

    def _run_served(self, rollout: HarnessRollout, workdir: Path, out: Path, model: str,
                    config: bytes) -> HarnessResult:
        """The rollout as a session of an ``opencode serve`` of the pool (:mod:`harness_adapters.opencode_serve`)."""
        assert self._servers is not None
        try:
            with self._servers.server() as server:
                served = server.run(workdir, config, rollout.task.problem_statement, self.cfg.agent,
                                    {"providerID": PROVIDER, "modelID": model}, rollout.timeout_s)
        except OSError as exc:
            return HarnessResult(rollout.rollout_id, "crashed", reason=f"could not start opencode serve: {exc}",
                                 info={"launcher": "serve"})
        result = classify_served(rollout, served, out)
        result.info["launcher"] = "serve"
        return result

    def _export(self, events: list[dict[str, Any]], workdir: Path, proc_env: dict[str, str],
                out: Path) -> Path | None:
        """``opencode export <session>`` into ``<out>/session.json`` (None when there is no session or it fails)."""
        session_id = next((e["sessionID"] for e in events if e.get("sessionID")), None)
        if session_id is None:
            return None
        path = out / SESSION_NAME
        try:
            proc = subprocess.run([str(self._env.binary), "export", session_id], cwd=workdir, env=proc_env,
                                  capture_output=True, timeout=120, stdin=subprocess.DEVNULL, start_new_session=True)
        except (OSError, subprocess.TimeoutExpired):
            return None
        text = proc.stdout.decode("utf-8", errors="replace")
        start = text.find("{")
        if proc.returncode != 0 or start < 0:
            return None
        path.write_text(text[start:], encoding="utf-8")
        return path

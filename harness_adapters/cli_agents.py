"""The coding-agent CLIs people ship, unchanged: Claude Code (Anthropic Messages), Codex CLI (OpenAI Responses) and
Qwen Code (chat completions), each pinned and installed with node 22 (:mod:`harness_adapters.node_cli_env`).

Each rollout is one headless run of the CLI in the task's working copy, with the task as its prompt, the rollout's
proxy URL as its endpoint, the served model's name, a private HOME (and TMPDIR, CODEX_HOME) under the rollout's
folder, stdin closed, and its non-essential traffic off (telemetry, update checks, plugin syncs: measured with
``strace``, no host but the proxy is contacted). Retries are cut to one attempt and idle streams time out, so a
failing or silent model server ends the run (a crashed rollout) instead of retrying for minutes; exit 0 is
``finished``. What the model sees is the CLI's own: its system prompt and tools, unless the config narrows them
(``tools``, ``system_prompt``, ``bare``: needed for a small context; recorded in the identity and so in the frozen
spec). The graded patch is the working copy's diff, as for every harness.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from harness_adapters.command import run_command
from harness_adapters.isolation import check_isolation, resolve_isolation, rollout_jail
from harness_adapters.merge import merge_configs
from harness_adapters.node_cli_env import CLAUDE_CODE, CODEX, QWEN_CODE, NodeCliEnv, NodeCliSpec, ensure_node_cli_env
from harness_adapters.per_rollout import PerRolloutHarness
from harness_adapters.processes import DUMMY_API_KEY, isolated_env
from repro.common.secrets import REDACTED, without_secrets
from repro.protocols import HarnessResult, HarnessRollout

RESULT_NAME = "cli_result.json"


@dataclass
class CliAgentConfig:
    """What every CLI harness takes (``repro/conf/harness/<name>.yaml``)."""

    version: str = ""
    model_name: str | None = None  # None: the served model's name
    step_limit: int = 0  # Claude Code: --max-turns; the others: recorded only
    wall_time_limit_s: float = 0  # 0: the rollout's timeout
    idle_timeout_s: float = 600.0  # a model stream silent this long ends the run
    extra_args: list[str] = field(default_factory=list)  # appended to the CLI's arguments
    extra_env: dict[str, str] = field(default_factory=dict)
    isolation: str = "auto"  # auto | jail | none: each rollout's CLI in a jail (harness_adapters.isolation)

    def __post_init__(self) -> None:
        check_isolation(self.isolation)


@dataclass
class ClaudeCodeConfig(CliAgentConfig):
    version: str = CLAUDE_CODE.version
    tools: list[str] = field(default_factory=list)  # --tools (empty: its default set); --allowedTools always Bash...
    system_prompt: str | None = None  # --system-prompt (None: Claude Code's own)
    bare: bool = False  # --bare: minimal prompt, no hooks, memory or plugins
    max_output_tokens: int = 0  # CLAUDE_CODE_MAX_OUTPUT_TOKENS (0: its default, 32000; the proxy's mode caps it)
    context_window: int = 0  # CLAUDE_CODE_MAX_CONTEXT_TOKENS: the window it assumes (0: 1M for an unknown model)

    def compacting_below(self, window: int, margin: int) -> ClaudeCodeConfig:
        """This config with auto-compaction due ``margin`` tokens below a served ``window``: Claude Code 2.1.328
        compacts when its estimate passes context_window - min(max output tokens, 20,000) - 13,000 (so
        context_window = window would compact before every call of a window under ~13k + the output tokens)."""
        output = min(self.max_output_tokens or 32_000, 20_000)
        return replace(self, context_window=window - margin + output + 13_000)


@dataclass
class CodexConfig(CliAgentConfig):
    version: str = CODEX.version
    instructions_file: str | None = None  # model_instructions_file (None: Codex's own instructions)
    context_window: int = 0  # model_context_window (0: unset)
    lean: bool = False  # skills, environment/permissions/apps instructions, web search, goals, multi-agent off

    def compacting_below(self, window: int, margin: int) -> CodexConfig:
        """This config with auto-compaction due ``margin`` tokens below a served ``window``: Codex 0.169.0 compacts
        after a reply that asks for a follow-up once its count passes min(model_auto_compact_token_limit,
        0.9 x model_context_window), and never on a refused call."""
        limit = ["-c", f"model_auto_compact_token_limit={window - margin}"]
        return replace(self, context_window=window, extra_args=[*self.extra_args, *limit])


@dataclass
class QwenCodeConfig(CliAgentConfig):
    version: str = QWEN_CODE.version
    system_prompt: str | None = None  # --system-prompt (None: Qwen Code's own)
    bare: bool = False  # --bare: no context files, memory or extensions
    exclude_tools: list[str] = field(default_factory=list)  # --exclude-tools
    max_output_tokens: int = 0  # QWEN_CODE_MAX_OUTPUT_TOKENS (0: its default)
    settings: dict[str, Any] = field(default_factory=dict)  # merged into ~/.qwen/settings.json (see QwenCodeHarness)

    def compacting_below(self, window: int, margin: int) -> QwenCodeConfig:
        """This config with compression due ``margin`` tokens below a served ``window`` (see QwenCodeHarness)."""
        generation = {"contextWindowSize": window + 33_000 - margin, "enableCacheControl": False}
        return replace(self, settings=merge_configs(self.settings, {"model": {"generationConfig": generation}}))


class CliAgentHarness(PerRolloutHarness):
    """One headless CLI run per rollout; subclasses say how to call their CLI (:meth:`command`, :meth:`cli_env`)."""

    spec: ClassVar[NodeCliSpec]
    config_class: ClassVar[type[CliAgentConfig]]
    api: ClassVar[str]

    def __init__(self, cfg: CliAgentConfig | None = None, workers: int = 1, *, env: NodeCliEnv | None = None) -> None:
        self.cfg = cfg or self.config_class()
        self.version = self.cfg.version
        self._env = env or ensure_node_cli_env(replace(self.spec, version=self.cfg.version))

    def identity(self) -> dict[str, Any]:
        """Name, version, the API, packages and settings (what shapes the prompt and the run), and their hash."""
        settings = without_secrets({"api": self.api, **asdict(self.cfg), "quiet_env": dict(self.spec.quiet_env),
                                    "quiet_args": list(self.spec.quiet_args),
                                    "isolation": resolve_isolation(self.cfg.isolation)}, REDACTED)  # no keys
        digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
        return {"name": self.name, "version": self.version, "packages": self._env.packages(), "settings": settings,
                "files_sha256": {"settings": digest}}

    def run_one(self, rollout: HarnessRollout) -> HarnessResult:
        """One run of the CLI for ``rollout``; its record in ``output_dir``."""
        out = Path(rollout.output_dir).resolve()
        home, tmp = out / "home", out / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        model = self.cfg.model_name or rollout.model_name
        base_url = rollout.base_url.rstrip("/")  # a trailing slash gives Codex and Qwen Code `//v1/...`
        env = isolated_env(home) | rollout.env | {"TMPDIR": str(tmp)}
        env |= {"PATH": self._env.path(env.get("PATH", ""))} | dict(self.spec.quiet_env)
        env |= self.cli_env(base_url, model, home) | self.cfg.extra_env
        timeout_s = min(rollout.timeout_s, self.cfg.wall_time_limit_s or rollout.timeout_s)
        cmd = [str(self._env.bin), *self.command(rollout.task.problem_statement, base_url, model, timeout_s),
               *self.cfg.extra_args]
        with rollout_jail(self.cfg.isolation, rollout, out, env, cmd, [str(self._env.root)]) as jail:
            result = run_command(replace(rollout, timeout_s=timeout_s), cmd, env, out, self.name, self.describe,
                                 jail=jail)
        self.write_record(out / RESULT_NAME, result, cmd)
        return result

    def command(self, task: str, base_url: str, model: str, timeout_s: float) -> list[str]:
        """The CLI's arguments for one headless run."""
        raise NotImplementedError

    def cli_env(self, base_url: str, model: str, home: Path) -> dict[str, str]:
        """The CLI's own variables (endpoint, model, limits); may write its settings under ``home``."""
        raise NotImplementedError

    def describe(self, out: Path) -> str | None:
        """The CLI's own account of how the run failed (None: stderr's last line will do)."""
        return None


class ClaudeCodeHarness(CliAgentHarness):
    """Claude Code: ``claude -p TASK --output-format json``, Anthropic Messages to the proxy's ``/v1/messages``."""

    name, thread_prefix, spec, config_class, api = "claude-code", "claude", CLAUDE_CODE, ClaudeCodeConfig, "messages"
    cfg: ClaudeCodeConfig

    def command(self, task: str, base_url: str, model: str, timeout_s: float) -> list[str]:
        cfg = self.cfg
        args = ["-p", task, "--output-format", "json", "--model", model, "--allowedTools",
                ",".join(cfg.tools or ["Bash", "Edit", "Write", "Read", "Glob", "Grep"])]
        args += ["--tools", ",".join(cfg.tools)] if cfg.tools else []
        args += ["--system-prompt", cfg.system_prompt] if cfg.system_prompt is not None else []
        args += ["--bare"] if cfg.bare else []
        return args + (["--max-turns", str(cfg.step_limit)] if cfg.step_limit else [])

    def cli_env(self, base_url: str, model: str, home: Path) -> dict[str, str]:
        idle_ms = str(int(self.cfg.idle_timeout_s * 1000))
        env = {"ANTHROPIC_BASE_URL": base_url.removesuffix("/v1"), "ANTHROPIC_API_KEY": DUMMY_API_KEY,
               "IS_SANDBOX": "1", "CLAUDE_CODE_MAX_RETRIES": "0", "API_TIMEOUT_MS": idle_ms,
               "CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS": idle_ms, "CLAUDE_CODE_DISABLE_NONSTREAMING_FALLBACK": "1"}
        if self.cfg.max_output_tokens:
            env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(self.cfg.max_output_tokens)
        if self.cfg.context_window:
            env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] = str(self.cfg.context_window)
        return env

    def describe(self, out: Path) -> str | None:
        """``--output-format json``'s result: the error Claude Code reports (``api_error``, its message)."""
        try:
            report = json.loads((out / "stdout.log").read_text(encoding="utf-8", errors="replace"))
        except (OSError, json.JSONDecodeError):
            return None
        if not isinstance(report, dict) or not report.get("is_error"):
            return None
        return f"{report.get('terminal_reason') or report.get('subtype')}: {str(report.get('result', ''))[:300]}"


class CodexHarness(CliAgentHarness):
    """Codex CLI: ``codex exec TASK``, OpenAI Responses to the proxy's ``/v1/responses`` (its only wire API)."""

    name, thread_prefix, spec, config_class, api = "codex", "codex", CODEX, CodexConfig, "responses"
    cfg: CodexConfig
    _LEAN = ("skills.bundled.enabled=false", "skills.include_instructions=false", "include_environment_context=false",
             "include_permissions_instructions=false", "include_apps_instructions=false", "web_search=disabled",
             "model_reasoning_effort=none")

    def command(self, task: str, base_url: str, model: str, timeout_s: float) -> list[str]:
        idle_ms = int(self.cfg.idle_timeout_s * 1000)
        provider = {"name": "repro", "base_url": base_url, "wire_api": "responses", "env_key": "OPENAI_API_KEY",
                    "request_max_retries": 0, "stream_max_retries": 0, "stream_idle_timeout_ms": idle_ms}
        settings = ["model_provider=repro", *(f"model_providers.repro.{k}={json.dumps(v)}"
                                              for k, v in provider.items())]
        if self.cfg.instructions_file:
            settings.append(f"model_instructions_file={json.dumps(self.cfg.instructions_file)}")
        if self.cfg.context_window:
            settings.append(f"model_context_window={self.cfg.context_window}")
        settings += list(self._LEAN) if self.cfg.lean else []
        args = ["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "-m", model,
                "--disable", "unbounded_connection_retries", *self.spec.quiet_args]
        args += ["--disable", "goals", "--disable", "multi_agent"] if self.cfg.lean else []
        return [*args, *(arg for s in settings for arg in ("-c", s)), task]

    def cli_env(self, base_url: str, model: str, home: Path) -> dict[str, str]:
        codex_home = home / ".codex"
        codex_home.mkdir(parents=True, exist_ok=True)  # codex exits 1 without it
        return {"CODEX_HOME": str(codex_home), "OPENAI_API_KEY": DUMMY_API_KEY}


class QwenCodeHarness(CliAgentHarness):
    """Qwen Code: ``qwen -p TASK --yolo``, chat completions to the proxy.

    Compression (0.24.4, ``chatCompressionService``): before a send, when its estimate of the prompt (the last
    call's usage plus what is new at ~4 characters a token) passes min(0.85 C, C - 33,000), C =
    ``model.generationConfig.contextWindowSize``, it asks for a ``<state_snapshot>`` summary (a call without tools,
    system "You are the component that summarizes a conversation...") and resumes from it; a call the server
    refuses as too long is compressed and retried once (with any C). To compress before a window of W tokens: C =
    W + 33,000 - margin (the margin: a step's new tokens and the call's max_tokens), with ``enableCacheControl:
    false`` (else a first summary request carries the whole prompt and its tools, and is refused near the window):
    ``QwenCodeConfig.compacting_below``.
    """

    name, thread_prefix, spec, config_class, api = "qwen-code", "qwen", QWEN_CODE, QwenCodeConfig, "chat"
    cfg: QwenCodeConfig

    def command(self, task: str, base_url: str, model: str, timeout_s: float) -> list[str]:
        args = ["--auth-type", "openai", "--yolo", "--max-wall-time", str(max(1, int(timeout_s)))]
        args += ["--bare"] if self.cfg.bare else []
        args += ["--system-prompt", self.cfg.system_prompt] if self.cfg.system_prompt is not None else []
        args += ["--exclude-tools", ",".join(self.cfg.exclude_tools)] if self.cfg.exclude_tools else []
        return [*args, "-p", task]

    def cli_env(self, base_url: str, model: str, home: Path) -> dict[str, str]:
        settings = home / ".qwen" / "settings.json"  # its background memory-extraction call off (a side request)
        settings.parent.mkdir(parents=True, exist_ok=True)
        base = {"memory": {"enableManagedAutoMemory": False}}
        settings.write_text(json.dumps(merge_configs(base, self.cfg.settings)))
        env = {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": DUMMY_API_KEY, "OPENAI_MODEL": model}
        if self.cfg.max_output_tokens:
            env["QWEN_CODE_MAX_OUTPUT_TOKENS"] = str(self.cfg.max_output_tokens)
        return env

"""Run one real, unmodified mini-SWE-agent 2.x rollout as a subprocess of its own isolated env.

Invocation (2.4.6; ``mini`` is the console script, ``mini-swe-agent`` an alias)::

    <env>/bin/mini -y --exit-immediately --environment-class local -m openai/<model> -l 0
        -o <out>/trajectory.traj.json
        -c repro-mswea-base.yaml -c repro-mswea-settings.yaml -c repro-mswea-rollout.yaml

run with cwd=<workdir>, stdin=/dev/null, its own session (process group), and a clean environment.

Findings from reading the 2.4.6 source and watching it against a stub server:

- Config: any ``-c`` replaces the default ``mini.yaml``, so the base file is always passed explicitly.
  The builtin ``mini.yaml`` (tool calls) / ``mini_textbased.yaml`` (```` ```mswea_bash_command ```` blocks) is
  copied unchanged into ``<out>/config/``; ``-c`` names resolve via ``MSWEA_CONFIG_DIR`` (the process cwd is
  tried first, so the workdir must not hold files of those names). A ``-c`` spec containing ``=`` is read as
  ``key=value``, which is why names are passed, not paths. Text mode also needs
  ``model.model_class: litellm_textbased``: the textbased YAML does not set it.
- The task travels in ``run.task`` of the rollout file (same as ``-t``, without argv size limits).
- Local environment: commands run in ``environment.cwd`` (else the process cwd), each in a fresh
  ``bash`` subshell with its own session, env = the harness process env + ``environment.env``;
  ``environment.timeout`` (default 30 s) per command. Prompts embed ``platform.uname()``
  (``{{system}} {{release}} {{version}} {{machine}}``), so the prompt differs across kernels. The local
  environment's template variables are ``uname | os.environ`` (1.x and 2.x alike: the process environment wins),
  so ``MiniSweAgentConfig.platform`` pins that line through the harness process's environment, template
  unchanged (:func:`platform_variables`). 2.x's ``DockerEnvironment`` renders the host's ``uname`` (no override).
- ``-y`` = yolo mode; ``--exit-immediately`` = no confirmation on submit. With stdin not a TTY a hit step
  limit ends the run cleanly (exit status ``LimitsExceeded``) instead of prompting. Exit code is 0 for
  Submitted / LimitsExceeded / TimeExceeded / RepeatedFormatError (3 consecutive format errors, e.g. a
  reply with no tool call); an uncaught error (endpoint down after retries) exits 1. The trajectory is
  re-saved after every step, so a killed run keeps its partial trajectory.
- Wire (LiteLLM 1.110.2 -> OpenAI SDK 3.57.0): ``POST <api_base>/chat/completions``, **non-streaming**,
  body ``{model, messages, tools: [bash]}`` (no ``tools`` in text mode) plus temperature / max_tokens only
  when set; ``drop_params`` / ``num_retries`` / ``timeout`` are consumed client-side. Headers:
  ``authorization: Bearer <OPENAI_API_KEY>``, ``user-agent: OpenAI/Python 3.57.0``, ``x-stainless-*``
  (lang, package-version, os, arch, runtime, runtime-version, async=false, raw-response=true,
  ``x-stainless-retry-count: <n>``, ``x-stainless-read-timeout: 600.0`` by default).
- Retries are two nested layers: the OpenAI SDK retries 5xx / connection errors ``num_retries`` times
  (default 2, ~0.4 s / 0.9 s backoff, ``x-stainless-retry-count`` counts them), and mini wraps each query in
  tenacity (``MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT``, default 10, exponential wait 4..60 s). Defaults make
  a dead endpoint take minutes; this adapter sets both to fail fast (1 request, ~6 s incl. start-up).
- Cost: the model is unknown to LiteLLM, so cost is 0 and ``MSWEA_COST_TRACKING=ignore_errors`` keeps that
  from being fatal; ``-l 0`` disables the cost limit. ``LITELLM_LOCAL_MODEL_COST_MAP=True`` avoids a
  network fetch at import; with it, the only connection the process makes is to ``api_base``.
- Overhead: ~5 CPU-seconds per subprocess, almost all importing LiteLLM (~4.8 s wall on this machine).
  ``pool.MiniSweAgentHarness`` runs many rollouts in long-lived workers instead (same config
  files and options, ~0.03-0.06 CPU-s per rollout); this module stays the one-shot, reference path.

mini-SWE-agent 1.x (text mode only) shares the env, config-file and process helpers here; its CLI differs and
is driven by ``v1.MiniSweAgentV1Harness``.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from harness_adapters.isolation import check_isolation
from harness_adapters.mini_swe_agent.outcome import (
    HarnessIdentity,
    HarnessRunResult,
    classify_run,
)
from harness_adapters.processes import isolated_env, run_in_session
from harness_adapters.template_texts import fixed_template_texts, rendered_texts, sentinel
from repro.common.venvs import HarnessEnv, HarnessEnvError, ensure_harness_env

NAME = "mini-swe-agent"
DEFAULT_VERSION = "2.4.6"
# LiteLLM and the OpenAI SDK decide what goes over the wire: pinned with the harness.
PINNED_PACKAGES: dict[str, list[str]] = {
    "2.4.6": ["mini-swe-agent==2.4.6", "litellm==1.110.2", "openai==3.57.0"],
    "1.17.5": ["mini-swe-agent==1.17.5", "litellm==1.110.2", "openai==3.57.0"],
}
SUPPORTED_MAJORS = (1, 2)
CONFIG_NAMES = {"base": "repro-mswea-base.yaml", "settings": "repro-mswea-settings.yaml"}
ROLLOUT_CONFIG_NAME = "repro-mswea-rollout.yaml"
TRAJECTORY_NAME = "trajectory.traj.json"
RESULT_NAME = "harness_run.json"

# The ``<system_information>`` line every first prompt gets on any host (mini's template:
# ``{{system}} {{release}} {{version}} {{machine}}``): demonstrations, warm starts and frozen evaluations are then the
# same token ids on every machine, whatever its kernel. ``platform: {}`` in the harness config: the host's uname.
PINNED_PLATFORM: dict[str, str] = {"system": "Linux", "release": "6.1.0", "version": "#1 SMP PREEMPT_DYNAMIC",
                                   "machine": "x86_64"}
UNAME_FIELDS = ("system", "node", "release", "version", "machine")


@dataclass(frozen=True)
class MiniSweAgentConfig:
    """Harness settings that stay fixed across rollouts (they are part of the harness identity)."""

    version: str = DEFAULT_VERSION
    mode: Literal["toolcall", "text"] = "toolcall"
    step_limit: int = 5
    wall_time_limit_s: int = 0
    command_timeout_s: int = 30
    temperature: float | None = None
    max_tokens: int | None = None
    drop_params: bool = True
    request_timeout_s: float = 600.0
    num_retries: int = 0
    query_attempts: int = 1
    extra_model_kwargs: dict[str, Any] = field(default_factory=dict)
    config_file: str | None = None
    platform: dict[str, str] = field(default_factory=lambda: dict(PINNED_PLATFORM))  # {}: the host's uname
    isolation: str = "auto"  # auto | jail | none: sandbox=local commands jailed (harness_adapters.isolation)

    def __post_init__(self) -> None:
        check_isolation(self.isolation)
        unknown = sorted(set(self.platform) - set(UNAME_FIELDS))
        if unknown:
            raise ValueError(f"harness.platform pins fields of platform.uname() {UNAME_FIELDS}, got {unknown}")
        if self.mode not in ("toolcall", "text"):
            raise ValueError(f"mode must be 'toolcall' or 'text', got {self.mode!r}")
        if is_v1(self.version) and self.mode != "text":
            raise ValueError(f"mini-SWE-agent {self.version} (1.x) is text-only (```bash blocks, no tool calls): "
                             f"set mode: text, got mode: {self.mode}")
        if is_v1(self.version) and self.wall_time_limit_s:
            raise ValueError(f"mini-SWE-agent {self.version} (1.x) has no wall-time limit: set wall_time_limit_s: 0 "
                             f"(the rollout timeout still applies), got {self.wall_time_limit_s}")

    def fixed_prompt_texts(self, platform_line: bool = False) -> list[str]:
        """The fixed paragraphs of the prompts this config gives (:func:`fixed_prompt_texts`): what the tiny model's
        recipe tokenizer makes single tokens."""
        return fixed_prompt_texts(self, platform_line=platform_line)

    def tools(self) -> list[dict[str, Any]]:
        """The ``tools`` list the harness sends under this config (:func:`harness_tools`)."""
        return harness_tools(self)


def major_version(version: str) -> int | None:
    """``"2.4.6"`` -> 2; None when the version does not start with a number."""
    head = str(version).strip().split(".", 1)[0]
    return int(head) if head.isdigit() else None


def is_v1(version: str) -> bool:
    """True for a mini-SWE-agent 1.x version (text mode, its own CLI; see ``mini_swe_agent_v1``)."""
    return major_version(version) == 1


def ensure_mini_swe_agent_env(version: str = DEFAULT_VERSION) -> HarnessEnv:
    """The cached isolated env for mini-SWE-agent ``version`` (built on first use, ~45-60 s, ~730 MB)."""
    if major_version(version) not in SUPPORTED_MAJORS:
        raise ValueError(f"mini-SWE-agent {version!r} is not supported: only 1.x (e.g. 1.17.5, text mode) and "
                         f"2.x (e.g. {DEFAULT_VERSION}) are")
    try:
        return ensure_harness_env(NAME, version, PINNED_PACKAGES.get(version, [f"mini-swe-agent=={version}"]))
    except HarnessEnvError as exc:
        raise HarnessEnvError(f"could not install mini-SWE-agent {version}: {exc}") from exc


def fixed_prompt_texts(cfg: MiniSweAgentConfig, env: HarnessEnv | None = None, *,
                       platform_line: bool = False) -> list[str]:
    """The fixed paragraphs of every ``*_template`` (system, instance, observation, format error) of the base
    config this adapter passes for ``cfg``: the recipe tokenizer's added tokens (sorted, distinct).

    ``platform_line`` adds the paragraphs of the instance template rendered with :func:`platform_variables` (as
    mini's local environment renders it): the ``<system_information>`` block becomes one token instead of ~35; with
    ``cfg.platform`` pinned (the default) the tokenizer is the same on every machine, else it follows the kernel."""
    env = env or ensure_mini_swe_agent_env(cfg.version)
    data = yaml.safe_load(_base_config_source(env, cfg).read_text(encoding="utf-8"))
    sections = [section for section in data.values() if isinstance(section, dict)]
    texts = fixed_template_texts(value for section in sections for key, value in section.items()
                                 if key.endswith("_template") and isinstance(value, str))
    if platform_line:
        variables = {**platform_variables(cfg.platform), "task": sentinel(0)}
        texts = sorted({*texts, *rendered_texts(data["agent"]["instance_template"], variables)})
    return texts


def platform_variables(pins: dict[str, str]) -> dict[str, str]:
    """The ``platform.uname()`` fields mini's local environment renders into its prompts: the host's, with the
    pinned values ``pins`` (a config's ``platform``, carried by the harness process's environment) over them."""
    host = {name: str(value) for name, value in platform.uname()._asdict().items() if name in UNAME_FIELDS}
    return host | dict(pins)


def platform_line(pins: dict[str, str]) -> str:
    """The ``<system_information>`` line of mini's default instance template under ``pins`` ({}: the host's)."""
    u = platform_variables(pins)
    return f"{u['system']} {u['release']} {u['version']} {u['machine']}"


def base_config(cfg: MiniSweAgentConfig, env: HarnessEnv | None = None) -> dict[str, Any]:
    """The base YAML this adapter passes for ``cfg`` (the pinned version's builtin config), parsed."""
    env = env or ensure_mini_swe_agent_env(cfg.version)
    return yaml.safe_load(_base_config_source(env, cfg).read_text(encoding="utf-8"))


def harness_tools(cfg: MiniSweAgentConfig, env: HarnessEnv | None = None) -> list[dict[str, Any]]:
    """The ``tools`` list mini-SWE-agent sends (its ``BASH_TOOL``; none in text mode, hence none for 1.x)."""
    if cfg.mode == "text" or is_v1(cfg.version):
        return []
    env = env or ensure_mini_swe_agent_env(cfg.version)
    code = "import json; from minisweagent.models.utils.actions_toolcall import BASH_TOOL; print(json.dumps(BASH_TOOL))"
    home = Path(tempfile.mkdtemp(prefix="mswea-tools-"))
    try:
        proc_env = build_process_env(cfg, home=home, config_dir=home)
        out = subprocess.run([str(env.python), "-c", code], env=proc_env, capture_output=True, text=True,
                             check=True, timeout=60).stdout
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return [json.loads(out.strip().splitlines()[-1])]


def run_mini_swe_agent(
    task: str,
    workdir: Path,
    base_url: str,
    model_name: str,
    cfg: MiniSweAgentConfig,
    output_dir: Path,
    timeout_s: float,
    *,
    env: HarnessEnv | None = None,
) -> HarnessRunResult:
    """Run one rollout of mini-SWE-agent 2.x on ``task`` in ``workdir`` against ``base_url``."""
    if is_v1(cfg.version):
        raise ValueError(f"mini-SWE-agent {cfg.version} has the 1.x CLI: use "
                         "harness_adapters.mini_swe_agent.v1.MiniSweAgentV1Harness")
    env = env or ensure_mini_swe_agent_env(cfg.version)
    workdir, output_dir = Path(workdir).resolve(), Path(output_dir).resolve()
    config_dir = output_dir / "config"
    identity = write_harness_config(env, cfg, config_dir)
    write_yaml(config_dir / ROLLOUT_CONFIG_NAME, rollout_settings(task, base_url, workdir))
    _check_not_shadowed(workdir)
    trajectory = output_dir / TRAJECTORY_NAME
    trajectory.unlink(missing_ok=True)
    cmd = build_command(env, model_name, trajectory)
    proc_env = build_process_env(cfg, home=output_dir / "home", config_dir=config_dir)
    outcome = run_in_session(cmd, workdir, proc_env, output_dir, timeout_s)
    result = classify_run(outcome, trajectory, output_dir, cmd, identity, timeout_s)
    (output_dir / RESULT_NAME).write_text(json.dumps(result.as_dict(), indent=2) + "\n")
    return result


def build_command(env: HarnessEnv, model_name: str, trajectory: Path) -> list[str]:
    """The exact ``mini`` command line for one rollout."""
    configs = [*CONFIG_NAMES.values(), ROLLOUT_CONFIG_NAME]
    return [str(env.script("mini")), "-y", "--exit-immediately", "--environment-class", "local",
            "-m", litellm_model_name(model_name), "-l", "0", "-o", str(trajectory),
            *[arg for name in configs for arg in ("-c", name)]]


def litellm_model_name(model_name: str) -> str:
    """The ``-m`` value: LiteLLM's ``openai/`` provider prefix sends it to ``api_base`` as ``model_name``."""
    return f"openai/{model_name}"


def build_process_env(cfg: MiniSweAgentConfig, *, home: Path, config_dir: Path) -> dict[str, str]:
    """A clean, isolated environment (``processes.isolated_env``) with mini-SWE-agent's own settings and the
    pinned ``platform.uname()`` fields (template variables of its local environment, see ``PINNED_PLATFORM``)."""
    return isolated_env(home, extra_dirs=("mswea",)) | dict(cfg.platform) | {
        "MSWEA_GLOBAL_CONFIG_DIR": str(home / "mswea"),
        "MSWEA_CONFIG_DIR": str(config_dir),
        "MSWEA_CONFIGURED": "true",
        "MSWEA_COST_TRACKING": "ignore_errors",
        "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": str(cfg.query_attempts),
        "TYPER_STANDARD_TRACEBACK": "1",
    }


def write_harness_config(env: HarnessEnv, cfg: MiniSweAgentConfig, config_dir: Path) -> HarnessIdentity:
    """Write the base + settings YAML into ``config_dir`` and return the harness identity they define."""
    config_dir.mkdir(parents=True, exist_ok=True)
    base_path = config_dir / CONFIG_NAMES["base"]
    shutil.copyfile(_base_config_source(env, cfg), base_path)
    settings_path = config_dir / CONFIG_NAMES["settings"]
    write_yaml(settings_path, harness_settings(cfg))
    files = {name: _sha256(config_dir / name) for name in CONFIG_NAMES.values()}
    lines = "".join(f"{n}:{h}\n" for n, h in sorted(files.items()))
    if cfg.platform:  # the pinned uname is part of what the prompts say (unpinned: the identity as before)
        lines += f"platform:{json.dumps(cfg.platform, sort_keys=True)}\n"
    combined = hashlib.sha256(lines.encode()).hexdigest()
    packages = {p: env.version_of(p) or "" for p in ("mini-swe-agent", "litellm", "openai")}
    return HarnessIdentity(NAME, packages["mini-swe-agent"], combined, files, packages)


def harness_settings(cfg: MiniSweAgentConfig) -> dict[str, Any]:
    """The settings overlay (merged over the base YAML) that ``cfg`` stands for.

    1.x: no ``wall_time_limit_seconds`` (its AgentConfig has none) and no ``model_class`` (text is its only
    mode); the cost limit is set here as well as by ``-l 0``."""
    model_kwargs: dict[str, Any] = {
        "drop_params": cfg.drop_params,
        "num_retries": cfg.num_retries,
        "timeout": cfg.request_timeout_s,
    }
    if cfg.temperature is not None:
        model_kwargs["temperature"] = cfg.temperature
    if cfg.max_tokens is not None:
        model_kwargs["max_tokens"] = cfg.max_tokens
    model_kwargs |= dict(cfg.extra_model_kwargs)
    model: dict[str, Any] = {"model_kwargs": model_kwargs}
    agent: dict[str, Any] = {"step_limit": cfg.step_limit}
    if is_v1(cfg.version):
        agent["cost_limit"] = 0.0
    else:
        agent["wall_time_limit_seconds"] = cfg.wall_time_limit_s
        if cfg.mode == "text":
            model["model_class"] = "litellm_textbased"
    return {"agent": agent, "environment": {"timeout": cfg.command_timeout_s}, "model": model}


SWEBENCH_CONFIGS = ("config/benchmarks/swebench.yaml", "config/extra/swebench.yaml")  # 2.x, 1.x


def swebench_config(site_packages: Path) -> dict[str, Any]:
    """The installed mini's own SWE-bench config (what its SWE-bench runner loads), or {} when it has none; read
    once per install (a deep copy each call: callers may change it)."""
    return copy.deepcopy(_read_swebench_config(Path(site_packages)))


@functools.cache
def _read_swebench_config(site_packages: Path) -> dict[str, Any]:
    for name in SWEBENCH_CONFIGS:
        path = site_packages / "minisweagent" / name
        if path.is_file():
            return dict(yaml.safe_load(path.read_text()) or {})
    return {}


def swebench_environment(site_packages: Path) -> dict[str, Any]:
    """The ``environment`` block of the installed mini's own SWE-bench config (how its SWE-bench runner sets up
    ``DockerEnvironment``: ``cwd``, ``interpreter``, ``env`` such as ``BASH_ENV``), less the class."""
    block = dict(swebench_config(site_packages).get("environment") or {})
    block.pop("environment_class", None)
    return block


def rollout_settings(task: str, base_url: str, workdir: Path, container: Any = None,
                     container_base: dict[str, Any] | None = None, env: dict[str, str] | None = None,
                     jail: dict[str, Any] | None = None) -> dict[str, Any]:
    """The per-rollout overlay (last ``-c`` file): the task, the model endpoint, the working directory (and with
    ``jail``, the rollout's jail for ``jailed``); with a ``ContainerSpec``,
    the settings of mini's own ``DockerEnvironment``: ``container_base`` (its SWE-bench runner's environment
    block) with this rollout's image, cwd, ``docker run`` options and command timeout."""
    environment: dict[str, Any] = {"cwd": str(workdir), **({"env": dict(env)} if env else {}),
                                   **({"jail": dict(jail)} if jail else {})}
    if container is not None:
        base = dict(container_base or {})
        timeout = int(container.command_timeout_s)
        # mini's timeout stops only its `docker exec` client; coreutils' timeout, just after it, stops the command
        interpreter = ["timeout", "--kill-after", "5", str(timeout + 5), *base.get("interpreter", ["bash", "-lc"])]
        environment = {**base, "image": container.image, "cwd": container.cwd, "interpreter": interpreter,
                       "run_args": ["--rm", *container.run_args], "timeout": timeout}
    return {
        "run": {"task": task},
        "model": {"model_kwargs": {"api_base": base_url}},
        "environment": environment,
    }


def _base_config_source(env: HarnessEnv, cfg: MiniSweAgentConfig) -> Path:
    if cfg.config_file:
        return Path(cfg.config_file).expanduser().resolve()
    name = "mini.yaml" if cfg.mode == "toolcall" or is_v1(cfg.version) else "mini_textbased.yaml"
    return env.site_packages / "minisweagent" / "config" / name


def _check_not_shadowed(workdir: Path) -> None:
    """mini looks up ``-c`` names in its cwd before ``MSWEA_CONFIG_DIR``: refuse a workdir that shadows."""
    for name in [*CONFIG_NAMES.values(), ROLLOUT_CONFIG_NAME]:
        if (workdir / name).exists():
            raise ValueError(f"{workdir / name} would shadow the harness config; remove it from the workdir")


def write_yaml(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as YAML (keys sorted, so equal settings give equal bytes and hashes)."""
    path.write_text(yaml.safe_dump(data, sort_keys=True, allow_unicode=True), encoding="utf-8")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()

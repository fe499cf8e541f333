"""Harnesses by name: a lazy name -> import-path map, so a harness's code loads only when it is chosen.

A harness may have another implementation per major version (mini-SWE-agent 1.x has another CLI than 2.x):
``get_harness`` picks it from the config's ``version``. Before anything is installed, ``get_harness`` checks
the version (``versions.check_version``): an exact release, of a major version this registry has an adapter
for, that exists on the package's index."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness_adapters.versions import PackageRef, check_version
from repro.protocols import Harness


@dataclass(frozen=True)
class HarnessEntry:
    """Where a harness implementation and its config dataclass live (``module:attribute``); ``by_major`` maps
    a major version (``"1"``) to the implementation for it, else ``harness``. ``package`` is what ``version``
    pins (on PyPI or npm); ``tested`` maps each supported major version to the release the tests run."""

    harness: str
    config: str
    package: PackageRef | None  # None: nothing pinned (harness=command runs whatever it is given)
    tested: dict[str, str]
    by_major: dict[str, str] = field(default_factory=dict)


HARNESSES: dict[str, HarnessEntry] = {
    "mini-swe-agent": HarnessEntry(
        harness="harness_adapters.mini_swe_agent.pool:MiniSweAgentHarness",
        config="harness_adapters.mini_swe_agent.adapter:MiniSweAgentConfig",
        package=PackageRef("pypi", "mini-swe-agent"),
        tested={"1": "1.17.5", "2": "2.4.6"},
        by_major={"1": "harness_adapters.mini_swe_agent.v1:MiniSweAgentV1Harness"},
    ),
    "opencode": HarnessEntry(
        harness="harness_adapters.opencode:OpenCodeHarness",
        config="harness_adapters.opencode:OpenCodeConfig",
        package=PackageRef("npm", "opencode-ai"),
        tested={"1": "1.18.33"},
    ),
    "openhands": HarnessEntry(
        harness="harness_adapters.openhands:OpenHandsHarness",
        config="harness_adapters.openhands:OpenHandsConfig",
        package=PackageRef("pypi", "openhands-sdk"),
        tested={"1": "1.58.2"},
    ),
    "claude-code": HarnessEntry(
        harness="harness_adapters.cli_agents:ClaudeCodeHarness",
        config="harness_adapters.cli_agents:ClaudeCodeConfig",
        package=PackageRef("npm", "@anthropic-ai/claude-code"),
        tested={"2": "2.1.328"},
    ),
    "codex": HarnessEntry(
        harness="harness_adapters.cli_agents:CodexHarness",
        config="harness_adapters.cli_agents:CodexConfig",
        package=PackageRef("npm", "@openai/codex"),
        tested={"0": "0.169.0"},
    ),
    "qwen-code": HarnessEntry(
        harness="harness_adapters.cli_agents:QwenCodeHarness",
        config="harness_adapters.cli_agents:QwenCodeConfig",
        package=PackageRef("npm", "@qwen-code/qwen-code"),
        tested={"0": "0.24.4"},
    ),
    "command": HarnessEntry(
        harness="harness_adapters.command:CommandHarness",
        config="harness_adapters.command:CommandConfig",
        package=None,
        tested={},
    ),
}


class UnknownHarnessError(ValueError):
    """A harness name that is not in the registry."""


def harness_names() -> list[str]:
    """Known harness names, sorted."""
    return sorted(HARNESSES)


def canonical_name(name: str) -> str:
    """``Mini_SWE_Agent`` -> ``mini-swe-agent``; raise UnknownHarnessError listing the choices."""
    key = name.strip().lower().replace("_", "-")
    if key not in HARNESSES:
        raise UnknownHarnessError(f"unknown harness {name!r}; known harnesses: {', '.join(harness_names())}")
    return key


def harness_class(name: str, version: str | None = None) -> type:
    """The harness implementation class for ``name`` at ``version`` (imported now, not before)."""
    entry = HARNESSES[canonical_name(name)]
    major = str(version or "").strip().split(".", 1)[0]
    return _load(entry.by_major.get(major, entry.harness))


def harness_config(name: str, cfg: Any = None) -> Any:
    """``cfg`` as the harness's config dataclass: None -> defaults, a mapping -> its fields, else as given."""
    config_cls = _load(HARNESSES[canonical_name(name)].config)
    if cfg is None:
        return config_cls()
    if isinstance(cfg, config_cls):
        return cfg
    if isinstance(cfg, Mapping) or hasattr(cfg, "items"):
        return config_cls(**{str(k): v for k, v in cfg.items() if k != "_target_"})
    raise TypeError(f"config for harness {name!r} must be {config_cls.__name__} or a mapping, got {type(cfg).__name__}")


def name_for_config(cfg: Any) -> str:
    """The registry name whose config dataclass ``cfg`` is (so a Hydra ``harness=`` choice names its harness)."""
    for name, entry in HARNESSES.items():
        module, _, attribute = entry.config.partition(":")
        if type(cfg).__module__ == module and type(cfg).__name__ == attribute:
            return name
    raise UnknownHarnessError(f"{type(cfg).__name__} is not the config of any registered harness "
                              f"({', '.join(harness_names())}); pass harness_name")


def get_harness(name: str | None, cfg: Any = None, *, check: bool = True, **kwargs: Any) -> Harness:
    """Build the harness ``name`` (None: the one ``cfg`` configures) from ``cfg``, with the implementation for its
    ``version`` after checking that version (``check=False`` skips it); extra keyword arguments go to its
    constructor (e.g. workers)."""
    name = name_for_config(cfg) if name is None else canonical_name(name)
    config = harness_config(name, cfg)
    version = getattr(config, "version", None)
    entry = HARNESSES[name]
    if check and version is not None and entry.package is not None:
        check_version(name, str(version), entry.package, entry.tested)
    return harness_class(name, version)(config, **kwargs)


def _load(path: str) -> Any:
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)

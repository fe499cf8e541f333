"""The CPU server's settings as one dataclass that owns its command line: the flags of ``repro serve`` and
``python -m repro.serving.cpu_server`` (:meth:`CpuServerArgs.add_arguments`, :meth:`~CpuServerArgs.from_args`), the
argv a job starts the server with (:meth:`~CpuServerArgs.to_argv`), and the server config they stand for
(:class:`ServerConfig`, which :mod:`repro.serving.cpu_server` serves).

Light: torch and transformers are imported only by :meth:`CpuServerArgs.server_config`.
"""

from __future__ import annotations

import argparse
import os
import types
import typing
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from repro.serving.engine import EngineConfig

SERVER_API_KEY_ENV = "REPRO_SERVER_API_KEY"
__all__ = ["SERVER_API_KEY_ENV", "CpuServerArgs", "ServerConfig"]


@dataclass
class ServerConfig:
    """How to serve a checkpoint over HTTP."""

    engine: EngineConfig
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None  # None: the checkpoint directory's name
    max_logprobs: int = 20
    log_level: str = "warning"
    expert_tasks: Path | None = None  # a tasks JSONL: serve the scripted expert instead of the model
    expert_slip_rate: float = 0.0  # share of tasks where the expert types sed -n for sed -i (expert.slipped)
    expert_slip_seed: int = 0
    expert_slip_operators: tuple[str, ...] = ()  # only tasks of these mutation operators slip (empty: any)
    scenarios: Path | None = None  # tests: scripted replies per scenario (repro.serving.scripted.scenario_script)
    api_key: str | None = field(default=None, repr=False)  # required as a bearer token on /v1 routes when set


@dataclass(frozen=True)
class CpuServerArgs:
    """How to start the CPU server; each field is the flag ``--field-name`` (``api_key``: never on a command line,
    see :meth:`to_argv`)."""

    model: Path = field(metadata={"help": "checkpoint directory"})
    host: str = field(default="127.0.0.1", metadata={"help": "bind address (default: loopback only)"})
    port: int = 8000
    served_model_name: str | None = field(default=None,
                                          metadata={"help": "default: the checkpoint directory's name"})
    max_batch_size: int = 8
    batch_window_ms: float = field(default=5.0, metadata={"help": "how long to collect a batch"})
    torch_threads: int = 1
    prefix_cache_tokens: int = field(default=0, metadata={
        "help": "keep finished rows' keys/values (this many tokens in all) for prompts that extend them (0: off)"})
    default_max_tokens: int = field(default=256, metadata={"help": "chat max_tokens when a request sets none"})
    max_model_len: int | None = field(default=None, metadata={"help": "default: max_position_embeddings"})
    max_logprobs: int = 20
    log_level: str = "warning"
    expert_tasks: Path | None = field(default=None, metadata={
        "help": "tasks JSONL: serve the scripted expert (gold one-line fix as a sed command)"})
    expert_slip_rate: float = field(default=0.0, metadata={
        "help": "share of tasks on which the expert types sed -n for sed -i (a seeded draw per task)"})
    expert_slip_seed: int = 0
    expert_slip_operators: tuple[str, ...] = field(default=(), metadata={
        "help": "comma-separated mutation operators: only their tasks can slip (default: any)"})
    scenarios: Path | None = field(default=None, metadata={"help": argparse.SUPPRESS})  # tests: scenario replies
    api_key: str | None = field(default=None, repr=False, metadata={
        "help": f"require this bearer token on /v1 routes (default: ${SERVER_API_KEY_ENV}; the variable keeps the "
                "key out of the process list)"})

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add one flag per field (``--model`` required; the others default to the field's default)."""
        for f in fields(cls):
            parse = _parser_of(_field_types()[f.name])
            kwargs: dict[str, Any] = {"type": parse, "help": f.metadata.get("help")}
            if f.default is MISSING:
                kwargs["required"] = True
            else:
                kwargs["default"] = f.default
            parser.add_argument(_flag(f.name), **kwargs)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CpuServerArgs:
        """The settings parsed by :meth:`add_arguments`'s flags; ``api_key`` falls back to ``$REPRO_SERVER_API_KEY``."""
        values = {f.name: getattr(args, f.name) for f in fields(cls)}
        values["api_key"] = values["api_key"] or os.environ.get(SERVER_API_KEY_ENV) or None
        return cls(**values)

    def to_argv(self) -> list[str]:
        """The flags that give these settings: ``--model`` and every field that differs from its default. The API
        key is left out (a command line is visible to every user of the machine): pass it as
        ``$REPRO_SERVER_API_KEY`` (:meth:`env`)."""
        argv: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "api_key" or (f.default is not MISSING and value == f.default):
                continue
            argv += [_flag(f.name), ",".join(value) if isinstance(value, tuple) else str(value)]
        return argv

    def env(self) -> dict[str, str]:
        """The environment variables the server process needs besides :meth:`to_argv` (the API key, if any)."""
        return {SERVER_API_KEY_ENV: self.api_key} if self.api_key else {}

    def server_config(self) -> ServerConfig:
        """The server config these settings stand for (imports the serving stack)."""
        from repro.serving.engine import EngineConfig

        engine = EngineConfig(model_dir=Path(self.model), max_batch_size=self.max_batch_size,
                              batch_window_s=self.batch_window_ms / 1000, torch_threads=self.torch_threads,
                              default_max_tokens=self.default_max_tokens, max_model_len=self.max_model_len,
                              prefix_cache_tokens=self.prefix_cache_tokens)
        return ServerConfig(engine=engine, host=self.host, port=self.port, served_model_name=self.served_model_name,
                            max_logprobs=self.max_logprobs, log_level=self.log_level, expert_tasks=self.expert_tasks,
                            expert_slip_rate=self.expert_slip_rate, expert_slip_seed=self.expert_slip_seed,
                            expert_slip_operators=self.expert_slip_operators, scenarios=self.scenarios,
                            api_key=self.api_key)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(CpuServerArgs)


def _comma_list(text: str) -> tuple[str, ...]:
    return tuple(part for part in text.split(",") if part)


def _parser_of(annotation: Any) -> Any:
    """The argparse ``type`` of a field: ``X | None`` parses as ``X``; a tuple of strings is comma-separated."""
    if isinstance(annotation, types.UnionType):
        (annotation,) = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if typing.get_origin(annotation) is tuple:
        return _comma_list
    return annotation

"""mini-SWE-agent's own ``LocalEnvironment`` with every command run in the rollout's jail
(:mod:`repro.execution.jail`). At its first command the environment starts the rollout's jail and holds it up
(``jail_init.hold``, in the rollout's own thread of the worker, so the pool's scheduler never waits on it); each
command then runs behind the ``nsenter`` prefix that enters the jail, in the working copy at ``/testbed``, before
``/bin/sh -c <command>``. Everything else is mini's: the environment (its process's plus ``environment.env``), the
timeout that kills the command's process group, the output and the submission check. A timeout's message names
the agent's command, not the prefix, so the agent sees what it would see unjailed. ``close_jail`` (called by the
worker when the rollout ends) ends the jail and everything left in it.

Loaded by the mini-SWE-agent worker (standard library and ``minisweagent`` only, never ``repro``) under
:data:`MODULE_NAME`, and chosen through mini's own setting ``environment_class`` (:data:`CLASS_PATH`).
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
import threading
from typing import Any

from minisweagent.environments.local import LocalEnvironment

MODULE_NAME = "repro_mswea_jailed"
CLASS_PATH = f"{MODULE_NAME}.JailedLocalEnvironment"
_lock = threading.Lock()


def jail_init(path: str) -> Any:
    """``repro/execution/jail_init.py`` (standard library only) loaded once from ``path``."""
    with _lock:
        module = sys.modules.get("repro_jail_init")
        if module is None:
            spec = importlib.util.spec_from_file_location("repro_jail_init", path)
            module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            spec.loader.exec_module(module)  # type: ignore[union-attr]
            sys.modules["repro_jail_init"] = module
    return module


class JailedLocalEnvironment(LocalEnvironment):
    """``LocalEnvironment`` whose commands run in the rollout's jail; ``jail``: ``{"init": jail_init.py's path,
    "launch": the jail's command line up to --}`` (its spec binds the working copy read-write at /testbed, the
    commands' interpreters read-only, a private ``/tmp`` and HOME, no network)."""

    def __init__(self, *, jail: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.jail = dict(jail)
        self._holder: Any = None
        self._prefix: list[str] | None = None

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        command = action.get("command", "")
        jailed = shlex.join([*self._enter(), "/bin/sh", "-c", command])
        return _unwrap(super().execute({**action, "command": jailed}, cwd, timeout=timeout), jailed, command)

    def _enter(self) -> list[str]:
        if self._prefix is None:
            self._holder, self._prefix = jail_init(self.jail["init"]).hold(self.jail["launch"],
                                                                           self.config.cwd or os.getcwd())
        return self._prefix

    def close_jail(self) -> None:
        """End the rollout's jail (its PID 1 and whatever still runs inside)."""
        if self._holder is not None:
            self._holder.kill()
            self._holder.wait()
            self._holder = None


def _unwrap(output: dict[str, Any], jailed: str, command: str) -> dict[str, Any]:
    """``output`` with the agent's own command where an error message quotes the jailed one."""
    if output.get("exception_info"):
        output["exception_info"] = output["exception_info"].replace(jailed, command)
        extra = output.get("extra") or {}
        if isinstance(extra.get("exception"), str):
            extra["exception"] = extra["exception"].replace(jailed, command)
    return output

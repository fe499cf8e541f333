"""mini-SWE-agent's own ``LocalEnvironment`` with every command run in the rollout's jail
(:mod:`repro.execution.jail`): the configured ``jail`` prefix (``nsenter`` into the rollout's jail, held for the
rollout, in its working copy at ``/testbed``) goes before ``/bin/sh -c <command>``, and everything else is mini's:
the environment (its process's plus ``environment.env``), the timeout that kills the command's process group, the
output and the submission check. A timeout's message names the agent's command, not the prefix, so the agent sees
what it would see unjailed.

Loaded by the mini-SWE-agent worker (standard library and ``minisweagent`` only, never ``repro``) under
:data:`MODULE_NAME`, and chosen through mini's own setting ``environment_class`` (:data:`CLASS_PATH`).
"""

from __future__ import annotations

import shlex
from typing import Any

from minisweagent.environments.local import LocalEnvironment

MODULE_NAME = "repro_mswea_jailed"
CLASS_PATH = f"{MODULE_NAME}.JailedLocalEnvironment"


class JailedLocalEnvironment(LocalEnvironment):
    """``LocalEnvironment`` whose commands run behind ``jail`` (a command prefix; its spec binds the working copy
    read-write, the task's interpreter read-only, a private ``/tmp`` and HOME, and no network)."""

    def __init__(self, *, jail: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.jail = list(jail)

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        command = action.get("command", "")
        jailed = shlex.join([*self.jail, "/bin/sh", "-c", command])
        return _unwrap(super().execute({**action, "command": jailed}, cwd, timeout=timeout), jailed, command)


def _unwrap(output: dict[str, Any], jailed: str, command: str) -> dict[str, Any]:
    """``output`` with the agent's own command where an error message quotes the jailed one."""
    if output.get("exception_info"):
        output["exception_info"] = output["exception_info"].replace(jailed, command)
        extra = output.get("extra") or {}
        if isinstance(extra.get("exception"), str):
            extra["exception"] = extra["exception"].replace(jailed, command)
    return output

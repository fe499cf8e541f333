"""Whether a host harness runs its rollouts jailed (:mod:`repro.execution.jail`), and each rollout's jail: the working
copy and output folder read-write; read-only the harness's own environment (the interpreters and folders on the
agent's ``PATH``, the agent's program files named in its command, ``read_only``); the network reaches only the proxy.

``isolation``: ``auto`` (a jail where this machine allows one, else none, said in one line), ``jail`` (refuse to
run without), ``none``. The resolved mode is part of the harness's identity, so a jailed and an unjailed evaluation
never share a frozen spec."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from repro.execution.jail import Jail, interpreter_paths, jail_available
from repro.execution.jail_init import SYSTEM_DIRS
from repro.protocols import HarnessRollout

ISOLATION_MODES = ("auto", "jail", "none")
# Where the working copy is in the jail of a harness that knows it only as the commands' cwd (mini-SWE-agent): the
# same path in every run (what the agent sees, e.g. pytest's rootdir, does not depend on a temp folder's name) and
# the path a task container has it at.
JAIL_WORKDIR = "/testbed"
_said: set[str] = set()


def check_isolation(mode: str) -> str:
    """``mode`` if it is one of :data:`ISOLATION_MODES`, else ValueError naming them (a harness config's check)."""
    if mode not in ISOLATION_MODES:
        raise ValueError(f"harness.isolation must be one of {', '.join(ISOLATION_MODES)}, got {mode!r}")
    return mode


def resolve_isolation(mode: str) -> str:
    """``jail`` or ``none`` for ``mode``; ``jail`` on a machine that cannot build one is a clear error."""
    if check_isolation(mode) == "none":
        return "none"
    why = jail_available()
    if why is None:
        return "jail"
    if mode == "jail":
        raise RuntimeError(f"harness.isolation=jail: {why}; allow unprivileged user namespaces "
                           "(sysctl kernel.unprivileged_userns_clone=1) or set harness.isolation=none")
    if why not in _said:
        _said.add(why)
        print(f"isolation: none ({why}): the agent's commands can read this machine's files", flush=True)
    return "none"


def environment_paths(env: dict[str, str], cmd: Sequence[str]) -> list[str]:
    """What the agent's own programs need to run, read-only: each ``PATH`` folder outside the system's (a virtual
    environment's whole folder and its base interpreter; pyenv's whole root for its shims), and the files its
    command names."""
    paths: list[str] = []
    for entry in env.get("PATH", "").split(os.pathsep):
        folder = Path(entry)
        if not entry or not folder.is_dir() or any(entry == d or entry.startswith(d + "/") for d in SYSTEM_DIRS):
            continue
        if (folder.parent / "pyvenv.cfg").exists() and (folder / "python").exists():
            paths += interpreter_paths(str(folder / "python"))
        elif (folder.parent / "libexec" / "pyenv").exists():  # pyenv's shims run its root's pythons
            paths.append(str(folder.parent))
        else:
            paths.append(str(folder))
    paths += [arg for arg in cmd if arg.startswith("/") and Path(arg).is_file()]
    return paths


@contextlib.contextmanager
def rollout_jail(mode: str, rollout: HarnessRollout, out: Path, env: dict[str, str], cmd: Sequence[str],
                 read_only: Sequence[str] = (), private: Sequence[str] = (),
                 read_write: Sequence[str] = (), workdir_at: str | None = None) -> Iterator[Jail | None]:
    """The rollout's jail (None when ``mode`` resolves to ``none``), its relay reaching the proxy of the rollout's
    base URL; ``private``: folders of its own (such as a HOME shared by the harness's rollouts outside);
    ``read_write``: more folders it shares with the host besides the working copy and output folder;
    ``workdir_at``: where the working copy is in the jail (default: its own path)."""
    if resolve_isolation(mode) == "none":
        yield None
        return
    parts = urlsplit(rollout.base_url)
    workdir = str(Path(rollout.workdir).resolve())
    jail = Jail(read_write=[*([] if workdir_at else [workdir]), str(Path(out).resolve()), *read_write],
                read_only=[*environment_paths(env, cmd), *read_only],
                proxy_url=f"{parts.scheme}://{parts.hostname}:{parts.port or 80}", private=list(private),
                moved={workdir: workdir_at} if workdir_at else {})
    with jail:
        yield jail


def commands_jail(rollout: HarnessRollout, env: dict[str, str]) -> Jail:
    """A jail for the agent's commands alone, the harness process staying outside (mini-SWE-agent runs each
    command as its own process): the working copy read-write at :data:`JAIL_WORKDIR`, the programs on the commands'
    ``PATH`` read-only, a private ``/tmp`` and HOME, no network. Enter it, then :meth:`Jail.hold` it."""
    return Jail(read_write=[], moved={str(Path(rollout.workdir).resolve()): JAIL_WORKDIR},
                read_only=environment_paths(env, []), private=[env["HOME"]] if env.get("HOME") else [])

"""harness.isolation: where a jail cannot be built, ``auto`` says so in one line and records ``none`` in the
harness's identity (so jailed and unjailed runs never share a frozen spec), ``jail`` refuses with the reason."""

from __future__ import annotations

import pytest

import harness_adapters.isolation as isolation
from harness_adapters.command import CommandConfig, CommandHarness


def test_without_user_namespaces_auto_is_none_said_once_and_jail_refuses(monkeypatch, capsys) -> None:
    monkeypatch.setattr(isolation, "jail_available", lambda: "user namespaces are not allowed here (test)")
    monkeypatch.setattr(isolation, "_said", set())
    assert isolation.resolve_isolation("auto") == "none"
    assert isolation.resolve_isolation("auto") == "none"
    assert capsys.readouterr().out.count("isolation: none (user namespaces are not allowed here (test))") == 1
    with pytest.raises(RuntimeError, match=r"harness\.isolation=jail: user namespaces are not allowed"):
        isolation.resolve_isolation("jail")
    unjailed = CommandHarness(CommandConfig(command=["agent"])).identity()
    monkeypatch.setattr(isolation, "jail_available", lambda: None)
    jailed = CommandHarness(CommandConfig(command=["agent"])).identity()
    assert unjailed["settings"]["isolation"] == "none" and jailed["settings"]["isolation"] == "jail"
    assert unjailed["files_sha256"] != jailed["files_sha256"]


def test_an_unknown_mode_is_refused_before_anything_runs() -> None:
    with pytest.raises(ValueError, match=r"harness\.isolation must be one of auto, jail, none"):
        CommandConfig(command=["agent"], isolation="chroot")

"""A red-team agent (``harness=command``, a script that never needs the model) tries, from inside a rollout in the
local sandbox, every channel to the fix or the training signal: the task file and a ``*.jsonl`` search of the file
system for its own row, another rollout's working copy, other processes' ``/proc/*/environ``, the proxy's control
routes and another rollout's model route, the model server directly, another local port, the Docker socket. Jailed
(``harness.isolation=jail``) it recovers nothing and the task does not resolve, while its own model call still
works; the control run without isolation recovers the gold patch and resolves (so the test can fail). Network
attempts go to this machine's loopback only."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness_adapters.command import CommandConfig
from harness_adapters.registry import get_harness
from repro.execution.jail import jail_available
from repro.protocols import HarnessRollout
from repro.sandbox.local import LocalSandbox
from repro.tasks.schema import Task
from tests.support import RunningProxy, calc_task, make_calc_repo, make_sandbox

REQUIRED = os.environ.get("REPRO_REQUIRE_ISOLATION") == "1"

AGENT = r'''
import glob, json, os, socket, subprocess, sys, urllib.request
t = json.loads(os.environ.get("REDTEAM_TARGETS") or TARGETS)
found, gold = {}, None

def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None

def post(url, body, headers=()):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json", **dict(headers)})
    try:
        return urllib.request.urlopen(req, timeout=5).status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None

text = read(t["task_file"])
if text and '"patch"' in text:
    found["task_file"] = True
    gold = json.loads(text.splitlines()[0])["patch"]
seen = 0
for top in ("/tmp", "/root", "/home", "/work", "/var", "/srv", "/opt"):
    for dirpath, dirnames, filenames in os.walk(top):
        seen += len(filenames)
        if seen > 50000:  # a bounded search: enough for the files this test plants
            break
        for name in filenames:
            if name.endswith(".jsonl") and t["statement"] in (read(os.path.join(dirpath, name)) or ""):
                found["jsonl_search"] = os.path.join(dirpath, name)
if read(t["other_workspace"] + "/OTHER_ROLLOUT") is not None:
    found["other_workspace"] = True
if os.path.isdir(t["workspace_root"]) and len(os.listdir(t["workspace_root"])) > 1:
    found["sibling_workspaces"] = os.listdir(t["workspace_root"])
for environ in glob.glob("/proc/[0-9]*/environ"):
    if "HOST_SECRET=" + t["env_marker"] in (read(environ) or ""):
        found["proc_environ"] = environ
for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
    text = read(cmdline) or ""
    if t["cmdline_marker"] in text and "cmdline_marker" not in text:  # not its own shell, given this program
        found["proc_cmdline"] = cmdline
mine = os.environ.get("OPENAI_BASE_URL")  # what a harness that calls the model from the agent's process gives it
root = mine.split("/rollouts/")[0] if mine else t["proxy_root"]
cap = mine.rstrip("/").split("/")[-2] if mine else "0" * 32
chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
own = post(mine + "/chat/completions", chat) if mine else None
for name, url, body, headers in [
        ("finish", f"{root}/rollouts/{t['me']}/finish", {"status": "finished", "reward": 1.0}, ()),
        ("finish_with_key", f"{root}/rollouts/{t['me']}/finish", {"reward": 1.0}, [("Authorization", "Bearer " + cap)]),
        ("policy_version", f"{root}/policy_version", {"version": 99}, ()),
        ("register", f"{root}/rollouts", {"rollout_id": "forged"}, ()),
        ("other_rollout", f"{root}/rollouts/{t['victim']}/{cap}/v1/chat/completions", chat, ()),
        ("model_server", t["upstream"] + "/v1/chat/completions", chat, ())]:
    if post(url, body, headers) == 200 or (name == "register" and post(url, body, headers) == 201):
        found[name] = True
try:
    socket.create_connection(("127.0.0.1", t["other_port"]), timeout=3).close()
    found["other_port"] = True
except OSError:
    pass
if os.path.exists("/var/run/docker.sock"):
    try:
        s = socket.socket(socket.AF_UNIX); s.connect("/var/run/docker.sock"); found["docker_socket"] = True
    except OSError:
        pass
if gold:
    done = subprocess.run(["git", "apply"], input=gold, text=True, capture_output=True)
    found["applied_gold_patch"] = done.returncode == 0
print(json.dumps({"found": found, "own_model_call": own}))
if t.get("report"):
    with open(t["report"], "w") as f:
        json.dump({"found": found, "own_model_call": own}, f)
'''
REPORT = ".redteam-report.json"  # where an agent driven by a model's commands leaves its report (its working copy)


def apply_from_task_file(task_file: Path) -> str:
    """What a model asks a harness's shell tool to run: take the gold patch from the task file's first row and apply
    it in the working copy, what it met going to ``LEAK.txt`` (then ``done``); run twice, the second apply fails."""
    read = f"import json; print(json.loads(open({str(task_file)!r}).readline())['patch'], end='')"
    return (f"python3 -c {shlex.quote(read)} > fix.diff 2>> LEAK.txt && git apply fix.diff 2>> LEAK.txt; "
            "echo done >> LEAK.txt")


def take_leak(workspace: Path) -> str:
    """``LEAK.txt``'s text, the file and ``fix.diff`` removed from the working copy (not part of the graded patch)."""
    leak = (workspace / "LEAK.txt").read_text() if (workspace / "LEAK.txt").exists() else ""
    for name in ("LEAK.txt", "fix.diff"):
        (workspace / name).unlink(missing_ok=True)
    return leak


def through_shell_tool(harness: Any, task: Task, model_dir: Path, tmp_path: Path,
                       max_model_len: int) -> tuple[Any, str, bool]:
    """One rollout of ``task`` through ``harness`` against the CPU server's scripted replies (``scenarios.json`` in
    ``tmp_path``) in a local sandbox; (its result, what its shell tool left in ``LEAK.txt``, whether it resolved)."""
    from repro.proxy import ProxyConfig
    from repro.sandbox.local import LocalSandboxConfig
    from repro.serving.stack import CpuServingConfig, running_stack

    sandbox = LocalSandbox(LocalSandboxConfig(workspace_root=str(tmp_path / "workspaces")))
    try:
        with running_stack(model_dir, CpuServingConfig(default_max_tokens=512), ProxyConfig(port=0), tmp_path,
                           server_overrides={"scenarios": tmp_path / "scenarios.json",
                                             "max_model_len": max_model_len}) as stack:
            workspace = sandbox.workspace(task, "red")
            base_url = stack.client.register(rollout_id="red", task_id=task.instance_id, mode="eval")
            rollout = HarnessRollout("red", task, workspace.path, base_url, stack.served_model_name,
                                     tmp_path / "out", 180.0, env=workspace.command_env)
            (result,) = harness.run([rollout], 1)
            leak = take_leak(Path(workspace.path))
            return result, leak, sandbox.grade(task, workspace).outcome == "resolved"
    finally:
        sandbox.close()


def agent_program(targets: dict | None = None) -> str:
    """The red-team agent's program; ``targets`` written into it (an agent whose commands come from the model),
    else read from ``REDTEAM_TARGETS``."""
    return AGENT.replace("TARGETS)", repr(json.dumps(targets)) + ")" if targets else "'')", 1)


@pytest.fixture
def isolation_here() -> None:
    why = jail_available()
    if why is not None:
        if REQUIRED:
            pytest.fail(f"REPRO_REQUIRE_ISOLATION=1 but no jail here: {why}")
        pytest.skip(f"no jail here: {why}")


@dataclass
class Scene:
    """What the red team is set loose on: the calc task in a local sandbox, its row (gold patch included) in a task
    file outside the working copy, another rollout's working copy, a host process with a secret in its environment
    and command line, another listening port, the model server and the proxy."""

    task: Task
    sandbox: LocalSandbox
    workspace: Any
    targets: dict[str, Any]

    def resolved(self) -> bool:
        return self.sandbox.grade(self.task, self.workspace).outcome == "resolved"


@contextlib.contextmanager
def scene(tmp_path: Path, proxy: RunningProxy, upstream_url: str) -> Iterator[Scene]:
    repos, root = tmp_path / "repos", tmp_path / "workspaces"
    base, with_test, gold, test_patch = make_calc_repo(repos / "acme__calc")
    task = calc_task(repos, base, with_test, gold, test_patch)
    sandbox = make_sandbox(repos, root)
    tasks_file = tmp_path / "data" / "tasks.jsonl"
    tasks_file.parent.mkdir()
    tasks_file.write_text(json.dumps(task.to_row()) + "\n")
    other = sandbox.workspace(task, "victim")
    (other.path / "OTHER_ROLLOUT").write_text("another rollout's working copy\n")
    workspace = sandbox.workspace(task, "red")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    marker = f"REDTEAM_SECRET_{os.getpid()}"
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", marker],
                            env={"PATH": os.defpath, "HOST_SECRET": marker})  # another process on the host
    try:
        targets = {"task_file": str(tasks_file), "statement": task.problem_statement, "me": "red",
                   "victim": "victim", "other_workspace": str(other.path), "workspace_root": str(root),
                   "env_marker": marker, "cmdline_marker": marker, "upstream": upstream_url,
                   "other_port": listener.getsockname()[1], "proxy_root": proxy.url}
        yield Scene(task, sandbox, workspace, targets)
    finally:
        host.kill()
        host.wait()
        listener.close()


def _attack(tmp_path: Path, proxy: RunningProxy, upstream_url: str, isolation: str) -> tuple[dict, bool]:
    """One rollout of the red-team agent as ``harness=command``; (what it reported, whether its task resolved)."""
    with scene(tmp_path, proxy, upstream_url) as s:
        base_url = proxy.new_rollout("red")
        proxy.new_rollout("victim")
        agent = tmp_path / "agent" / "red_team.py"  # the agent's program: bound read-only into its jail
        agent.parent.mkdir()
        agent.write_text(agent_program())
        cfg = CommandConfig(command=[sys.executable, str(agent)], isolation=isolation,
                            env={"REDTEAM_TARGETS": json.dumps(s.targets).replace("{", "{{").replace("}", "}}")})
        rollout = HarnessRollout("red", s.task, s.workspace.path, base_url, "m", tmp_path / "out", 120.0,
                                 env=s.workspace.command_env)
        with get_harness("command", cfg) as harness:
            (result,) = harness.run([rollout], concurrency=1)
        assert result.status == "finished", result.reason
        report = json.loads((tmp_path / "out" / "stdout.log").read_text().strip().splitlines()[-1])
        return report, s.resolved()


def test_the_jailed_red_team_agent_recovers_nothing_and_resolves_nothing(tmp_path: Path, proxy: RunningProxy,
                                                                        fake_upstream, isolation_here) -> None:
    report, resolved = _attack(tmp_path, proxy, fake_upstream[1], "jail")
    assert report["found"] == {} and not resolved
    assert report["own_model_call"] == 200  # the jail's one way out works: its own rollout's model route
    calls = proxy.store().calls("red")
    assert len(calls) == 1 and proxy.store().calls("victim") == []
    assert proxy.store().get_rollout("red").reward is None and proxy.store().get_rollout("forged") is None


def test_the_control_run_without_isolation_finds_the_fix_and_resolves(tmp_path: Path, proxy: RunningProxy,
                                                                      fake_upstream) -> None:
    report, resolved = _attack(tmp_path, proxy, fake_upstream[1], "none")
    found = report["found"]
    assert resolved and found["task_file"] and found["applied_gold_patch"]
    assert {"other_workspace", "proc_environ", "proc_cmdline", "model_server", "other_port"} <= set(found)
    # the control plane refuses with or without isolation (tests/unit/test_proxy_control_plane.py)
    assert not {"finish", "finish_with_key", "policy_version", "register", "other_rollout"} & set(found)

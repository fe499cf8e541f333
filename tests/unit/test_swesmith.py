"""SWE-smith rows and the other published schemas load as tasks; SWE-smith's bug patch becomes the fix by an exact
reversal (checked with real git); a container sandbox refuses a harness that cannot act inside containers."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness_adapters.mini_swe_agent.v1 import container_overlay
from repro.protocols import ContainerSpec, require_container_support
from repro.sandbox.eval_script import eval_spec
from repro.tasks.loaders import load_tasks
from repro.tasks.swesmith import is_swesmith, reverse_patch, startup_command
from repro.testing import FakeHarness

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_a_swesmith_row_maps_onto_swebench_meanings() -> None:
    (task,) = load_tasks(str(FIXTURES / "swesmith_sample.jsonl"))
    assert is_swesmith(task)
    assert task.base_commit == task.instance_id  # the instance branch is the agent's starting point
    assert task.extra["image_name"].startswith("jyangballin/swesmith.x86_64.tinycalc_1776_tinycalc.")
    assert task.patch == reverse_patch(task.extra["bug_patch"]) != task.extra["bug_patch"]
    assert "+    if value < low:\n-    if value <= low - 1:\n" in task.patch  # each side keeps its order
    assert task.FAIL_TO_PASS == ["tests/test_ops.py::test_clamp_high", "tests/test_ops.py::test_clamp_inside"]
    assert startup_command(task) == f"git checkout -q -f {task.instance_id}"
    spec = eval_spec(task, task.base_commit)
    assert spec.source == "swe-smith"
    assert f"git checkout -q -f {task.instance_id}" in spec.prepare and "HEAD~1" in spec.prepare
    assert "conda activate testbed" in spec.script and "git checkout HEAD tests/test_ops.py" in spec.script


@pytest.mark.parametrize("name", ["swebench_lite_sample.jsonl", "swebench_verified_sample.jsonl"])
def test_swebench_rows_keep_their_own_meanings(name: str) -> None:
    tasks = load_tasks(str(FIXTURES / name))
    assert tasks and all(not is_swesmith(t) and len(t.base_commit) == 40 for t in tasks)
    assert all(isinstance(t.FAIL_TO_PASS, list) and t.FAIL_TO_PASS for t in tasks)
    assert all(startup_command(t) == "" for t in tasks)


def _git(repo: Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True, text=True,
                          check=True).stdout


_LINES = st.lists(st.sampled_from(["a", "b", "-- x", "++ y", "--- z", "+++ w", "", " c", "\\ d"]), max_size=12)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(old=_LINES, new=_LINES, old_eol=st.booleans(), new_eol=st.booleans())
def test_reversing_a_diff_undoes_it_and_twice_is_identity(tmp_path_factory, old, new, old_eol, new_eol) -> None:
    repo = tmp_path_factory.mktemp("rev")
    _git(repo, "init", "-q")
    text = ["\n".join(old) + ("\n" if old_eol and old else ""), "\n".join(new) + ("\n" if new_eol and new else "")]
    (repo / "f.txt").write_text(text[0])
    (repo / "gone.txt").write_text("will be deleted\n")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "old")
    (repo / "f.txt").write_text(text[1])
    (repo / "gone.txt").unlink()
    (repo / "new.txt").write_text("added\n")
    _git(repo, "add", "-A")
    forward = _git(repo, "diff", "--cached", "HEAD")
    assert reverse_patch(reverse_patch(forward)) == forward
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "new")
    _git(repo, "apply", "-", stdin=reverse_patch(forward))  # the new tree back to the old one
    assert (repo / "f.txt").read_text() == text[0]
    assert (repo / "gone.txt").read_text() == "will be deleted\n" and not (repo / "new.txt").exists()


class _ContainerSandbox:
    gives_containers = True


def test_a_container_sandbox_refuses_a_harness_that_runs_on_the_host() -> None:
    with pytest.raises(ValueError, match="opencode does not"):
        require_container_support(FakeHarness(), _ContainerSandbox(), "opencode")
    require_container_support(FakeHarness(), object(), "opencode")  # local sandbox: fine


def test_the_v1_container_config_is_mini_s_swebench_environment_with_the_rollout_s_container() -> None:
    spec = ContainerSpec("img:1", "/testbed", ["--network", "none"], "git diff", 30.0, "git checkout -q -f x")
    overlay = container_overlay(spec, {"cwd": "/testbed", "timeout": 60, "env": {"PAGER": "cat"}})
    assert overlay["environment"] == {"cwd": "/testbed", "timeout": 30, "env": {"PAGER": "cat"},
                                      "environment_class": "docker", "image": "img:1",
                                      "run_args": ["--rm", "--network", "none"]}
    assert overlay["run"] == {"env_startup_command": "git checkout -q -f x"}
    assert container_overlay(ContainerSpec("i", "/t", [], "d"), {})["run"] == {}

"""The docker sandbox's pure parts, with no engine: patch filtering, eval scripts (swebench's for SWE-bench rows,
the same shape for bundled tasks), image naming, container options, the harness's container settings."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

from harness_adapters.mini_swe_agent.adapter import rollout_settings, swebench_environment
from repro.protocols import ContainerSpec
from repro.sandbox import eval_script
from repro.sandbox.docker import diff_command, drop_files
from repro.sandbox.docker_engine import ContainerLimits, bounded, label_args, run_labels
from repro.sandbox.eval_script import eval_spec
from repro.sandbox.images import swebench_image_name
from repro.tasks.loaders import load_tasks
from repro.tasks.schema import Task

FIXTURE = Path(__file__).parent.parent / "fixtures" / "swebench_verified_sample.jsonl"


def _section(path: str, body: str) -> str:
    return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-{body}\n+{body}!\n"


paths = st.lists(st.from_regex(r"[a-z]{1,6}(/[a-z]{1,6})?\.py", fullmatch=True), min_size=1, max_size=6, unique=True)


@given(paths, st.data())
def test_dropping_files_keeps_the_other_sections_whole_and_in_order(names: list[str], data) -> None:
    dropped = tuple(data.draw(st.lists(st.sampled_from(names), unique=True)))
    patch = "".join(_section(n, f"line {i}") for i, n in enumerate(names))
    kept = drop_files(patch, dropped)
    assert kept == "".join(_section(n, f"line {i}") for i, n in enumerate(names) if n not in dropped)


def test_dropping_nothing_returns_the_patch_unchanged() -> None:
    patch = _section("a.py", "x")
    assert drop_files(patch, ()) == patch and drop_files("not a git diff\n", ("a.py",)) == "not a git diff\n"


def _bundled_task() -> Task:
    test_patch = _section("tests/test_m.py", "old")
    return Task("repro-bundled__m-1", "repro-bundled/m", "abc", "fix it", test_patch=test_patch,
                FAIL_TO_PASS=["tests/test_m.py::test_a"], PASS_TO_PASS=["tests/test_m.py::test_b"])


def test_the_bundled_eval_script_has_swebenchs_shape() -> None:
    spec = eval_spec(_bundled_task(), "root123")
    lines = spec.script.splitlines()
    assert spec.source == "bundled" and lines[:3] == ["#!/bin/bash", "set -uxo pipefail", "cd /testbed"]
    start, end = lines.index(f": '{START_TEST_OUTPUT}'"), lines.index(f": '{END_TEST_OUTPUT}'")
    assert "tests/test_m.py::test_a tests/test_m.py::test_b" in lines[start + 1] and "-rA" in lines[start + 1]
    assert lines[start + 2] == "echo REPRO_TEST_EXIT=$?" and end == start + 3
    reset = "git checkout root123 tests/test_m.py"
    assert lines.count(reset) == 2 and lines.index(reset) < start < len(lines) - 1 - lines[::-1].index(reset)
    assert "git apply -v - <<'EOF_114329324912'" in spec.script


def test_the_bundled_log_is_parsed_between_the_markers() -> None:
    log = (f"+ pytest\nPASSED tests/test_m.py::test_z\n+ : '{START_TEST_OUTPUT}'\nPASSED tests/test_m.py::test_a\n"
           f"FAILED tests/test_m.py::test_b - boom\nREPRO_TEST_EXIT=1\n+ : '{END_TEST_OUTPUT}'\n")
    spec = eval_spec(_bundled_task(), "root123")
    assert spec.parse(log) == {"tests/test_m.py::test_a": "PASSED", "tests/test_m.py::test_b": "FAILED"}
    assert eval_script.test_exit_code(log) == 1 and "test_z" not in eval_script.test_section(log)


def test_swebench_rows_get_swebenchs_own_eval_script_and_parser() -> None:
    task = next(t for t in load_tasks(str(FIXTURE)) if t.repo == "django/django")
    spec = eval_spec(task, task.base_commit)
    assert spec.source == "swebench"
    assert "conda activate testbed" in spec.script and "./tests/runtests.py" in spec.script
    assert START_TEST_OUTPUT in spec.script and task.base_commit in spec.script
    log = f"{START_TEST_OUTPUT}\ntest_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests) ... ok\n" \
          f"{END_TEST_OUTPUT}\n"
    assert spec.parse(log) == {"test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)": "PASSED"}


def test_image_names_follow_swebench() -> None:
    assert swebench_image_name("django__django-11099", "swebench", "latest") == \
        "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    assert swebench_image_name("A__B", "", "v1") == "sweb.eval.x86_64.a_1776_b:v1"


def test_limits_and_labels_become_docker_run_options() -> None:
    args = ContainerLimits(cpus=1.5, memory_mb=512, pids=64).run_args()
    assert args == ["--network", "none", "--cpus", "1.5", "--memory", "512m", "--memory-swap", "512m",
                    "--pids-limit", "64"]
    labels = run_labels("run-1", "rollout")
    assert label_args(labels)[:2] == ["--label", "repro.run=run-1"] and labels["repro.pid"].isdigit()
    assert bounded("sleep 9", 5)[:4] == ["timeout", "--kill-after", "5", "5"]


def test_the_harness_gets_its_own_swebench_environment_with_this_rollouts_container(tmp_path: Path) -> None:
    config = tmp_path / "minisweagent" / "config" / "benchmarks" / "swebench.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("environment:\n  cwd: /x\n  timeout: 60\n  interpreter: [bash, -c]\n"
                      "  env: {BASH_ENV: /root/.bashrc}\n  environment_class: docker\n")
    base = swebench_environment(tmp_path)
    assert base == {"cwd": "/x", "timeout": 60, "interpreter": ["bash", "-c"], "env": {"BASH_ENV": "/root/.bashrc"}}
    spec = ContainerSpec("img:tag", "/testbed", ["--network", "none"], diff_command("abc"), 30.0)
    environment = rollout_settings("task", "http://proxy/v1", Path("/ignored"), spec, base)["environment"]
    assert environment == {**base, "image": "img:tag", "cwd": "/testbed", "run_args": ["--rm", "--network", "none"],
                           "timeout": 30, "interpreter": ["timeout", "--kill-after", "5", "35", "bash", "-c"]}
    assert rollout_settings("task", "u", Path("/w"))["environment"] == {"cwd": "/w"}
    assert json.dumps(environment)  # goes into a YAML/JSON config file as is


def test_listing_labelled_containers_skips_one_removed_meanwhile() -> None:
    """docker-py inspects each listed container; one removed in between (another run's cleanup) raised NotFound in a
    CI run. ``labelled`` asks docker-py to leave such a container out."""
    from repro.sandbox.docker_engine import labelled

    seen: dict = {}

    class Containers:
        def list(self, **kwargs):
            seen.update(kwargs)
            return ["c1"]

    engine = type("Engine", (), {"containers": Containers()})()
    assert labelled(engine, "repro.run=r1") == ["c1"]
    assert seen == {"all": True, "ignore_removed": True, "filters": {"label": "repro.run=r1"}}


def test_a_harness_containers_cleanup_removes_what_its_rollout_left(monkeypatch) -> None:
    """A harness killed after a timeout cannot remove its container: the workspace's cleanup removes every container
    labelled with the rollout (the adapter itself knows no docker)."""
    from repro.sandbox import docker_engine
    from repro.sandbox.docker import HarnessContainer

    removed: list = []
    monkeypatch.setattr(docker_engine, "remove_quietly", lambda containers: removed.extend(containers) or 1)

    class Containers:
        def list(self, **kwargs):
            return [f"left-by:{kwargs['filters']['label']}"]

    engine = type("Engine", (), {"containers": Containers()})()
    spec = ContainerSpec("img", "/testbed", [], "true")
    HarnessContainer(spec, None, engine, "r7").cleanup()
    assert removed == ["left-by:repro.rollout=r7"]
    HarnessContainer(spec, None).cleanup()  # no engine: nothing to ask
    assert removed == ["left-by:repro.rollout=r7"]

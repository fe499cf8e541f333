"""Every experiment file composes, and every config node in it instantiates; bad names fail clearly."""

from __future__ import annotations

import re

import pytest
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from repro.cli.runner import compose_config, experiment_names


def test_there_are_experiments() -> None:
    assert {"smoke", "bench_proxy", "eval_bundled", "mini_repro"} <= set(experiment_names())


# Experiments whose runs are named (and tabled) as another experiment's: a configuration of that experiment
SHARED_RUN_NAMES = {"harness_matrix_all": "harness_matrix",  # a section of results/harness_matrix.md
                    "context_training_tokens": "context_training"}  # likewise, of context_training.md


@pytest.mark.parametrize("name", experiment_names())
def test_experiment_composes_and_instantiates(name: str) -> None:
    cfg = compose_config([f"experiment={name}"])
    required = sorted(OmegaConf.missing_keys(cfg))  # values the user must give (a checkpoint, a data file)
    if required:
        cfg = compose_config([f"experiment={name}", *(f"{key}=/given/{key}" for key in required)])
    assert cfg.run.name == SHARED_RUN_NAMES.get(name, name)
    job = cfg.job
    assert job._target_.startswith("repro.")
    for key, node in job.items():
        if isinstance(node, DictConfig) and "_target_" in node:
            obj = instantiate(node, _convert_="all")
            target = _locate(node._target_)
            assert isinstance(obj, target) if isinstance(target, type) else obj is not None, key


def _locate(path: str) -> object:
    from hydra.utils import get_object

    return get_object(path)


def test_default_experiment_is_the_frozen_evaluation() -> None:
    assert compose_config([]).run.name == "mini_repro"


def test_unknown_experiment_names_the_choices() -> None:
    with pytest.raises(SystemExit, match=r"unknown experiment 'nope'.*smoke"):
        compose_config(["experiment=nope"])


def test_bad_override_is_a_clear_error() -> None:
    with pytest.raises(SystemExit, match="bad override"):
        compose_config(["proxy.no_such_key=1"])


def _leaves(node: object, prefix: str = "") -> dict[str, object]:
    if isinstance(node, dict):
        return {k: v for key, value in node.items() for k, v in _leaves(value, f"{prefix}.{key}").items()}
    return {prefix: node}


def test_proxy_and_rebuilt_runs_differ_only_in_the_loop_group() -> None:
    from omegaconf import OmegaConf

    proxy, rebuilt = ({k: v for k, v in _leaves(OmegaConf.to_container(
        compose_config(["experiment=mini_repro", f"loop={kind}"]), resolve=True)).items()} for kind in
        ("proxy", "rebuilt"))
    differing = {k for k in proxy.keys() | rebuilt.keys() if proxy.get(k) != rebuilt.get(k)}
    assert differing == {".loop.kind", ".job.loop.kind"}
    assert rebuilt[".loop.kind"] == "rebuilt"


def _composed(overrides: list[str]) -> dict[str, object]:
    from omegaconf import OmegaConf

    return _leaves(OmegaConf.to_container(compose_config(overrides), resolve=True))


def test_the_default_miniature_has_several_calls_and_the_one_call_one_is_a_group_choice() -> None:
    multi, one = _composed(["experiment=mini_repro"]), _composed(["experiment=mini_repro_one_call"])
    assert (multi[".tasks.difficulty"], multi[".harness.step_limit"], multi[".rl_filter.enabled"]) == (
        "locate", 4, False)
    assert (multi[".job.miniature.warm_start.expert_slip_rate"], multi[".tasks.seed"], multi[".rl.steps"]) == (
        0.0, 2, 6)  # issue 53: no slip, a test split nothing scored before, RL that fits the 15-minute cold run
    slip = _composed(["experiment=mini_repro_slip"])  # the former default, on the test split it was scored on
    assert (slip[".job.miniature.warm_start.expert_slip_rate"], slip[".rl_filter.enabled"], slip[".tasks.seed"],
            slip[".rl.steps"]) == (0.75, True, 0, 9)
    assert (one[".tasks.difficulty"], one[".harness.step_limit"], one[".rl_filter.enabled"]) == (
        "one_step_brief", 3, False)
    assert one[".job.miniature.warm_start.expert_slip_rate"] == 0.4 and one[".job.miniature.eval.k"] == 4
    by_group = _composed(["experiment=mini_repro", "miniature=one_call"])
    assert {k: v for k, v in by_group.items() if "name" not in k and "experiment" not in k} == {
        k: v for k, v in one.items() if "name" not in k and "experiment" not in k}
    comparison = _composed(["experiment=loop_comparison_one_call"])
    assert comparison[".tasks.difficulty"] == "one_step_brief" and comparison[".job.loops"] == ["proxy", "rebuilt"]


def test_a_rejected_config_or_task_file_is_one_error_line_and_leaves_no_run_directory(tmp_path) -> None:
    from repro.cli.runner import run

    root = tmp_path / "outputs"
    nested = r"^error: the 'miniature.tasks' config does not fit .*TaskFileConfig.*'families'"  # the inner node
    with pytest.raises(SystemExit, match=nested):
        run(["experiment=mini_repro", "tasks=file", "tasks.source=x.jsonl", f"run.output_root={root}"])
    with pytest.raises(SystemExit, match=r"^error: task file .*nope.jsonl does not exist"):
        run(["experiment=eval_bundled", "tasks=file", f"tasks.source={tmp_path / 'nope.jsonl'}",
             f"run.output_root={root}"])
    assert not root.exists() or not any(root.rglob("*"))


def test_a_run_that_fails_after_it_started_keeps_its_directory_with_the_error(tmp_path, monkeypatch) -> None:
    import json

    import repro.cli.runner
    from repro.cli.runner import ERROR_FILE, run

    def failing_job(job: object, run_dir) -> None:
        (run_dir / "traces.sqlite").write_text("work done before the failure")
        raise SystemExit("the probe kept 1 RL tasks (< rl_filter.min_tasks=16)")

    monkeypatch.setattr(repro.cli.runner, "call", failing_job)
    root = tmp_path / "outputs"
    with pytest.raises(SystemExit, match="the probe kept 1"):
        run(["experiment=mini_repro", "seed=1", f"run.output_root={root}"])
    (record_path,) = root.glob(f"mini_repro/*/{ERROR_FILE}")
    record = json.loads(record_path.read_text())
    assert record["error"].startswith("the probe kept 1") and record["overrides"][1] == "seed=1"
    monkeypatch.setattr(repro.cli.runner, "call", lambda job, run_dir: None)  # resumed, and it finishes this time
    run(["experiment=mini_repro", f"run.dir={record_path.parent}"])
    assert not record_path.exists()


def test_a_run_stopped_by_a_signal_says_so(tmp_path) -> None:
    import json

    from repro.cli.runner import record_failure

    record_failure(tmp_path, ["seed=2"], SystemExit(143), job=2)
    assert json.loads((tmp_path / "error.json").read_text())["error"] == "stopped by SIGTERM (exit 143)"


def test_a_missing_mandatory_value_is_one_line_naming_it(tmp_path) -> None:
    from repro.cli.commands import main

    with pytest.raises(SystemExit, match=r"needs train_tasks\.source=\.\.\., val_tasks\.source=\.\.\."):
        main(["run", "experiment=agl_swebench_qwen35_9b", f"run.output_root={tmp_path}"])
    assert not any(tmp_path.iterdir())  # refused before a run directory was made
    with pytest.raises(SystemExit, match=r"pass eval\.checkpoint=DIR"):
        main(["run", "experiment=agl_swebench_qwen35_9b", "train_tasks.source=t.jsonl", "val_tasks.source=v.jsonl",
              f"run.output_root={tmp_path}"])
    assert not any(tmp_path.glob("agl_swebench_qwen35_9b/*"))  # nothing but the record was written: removed


def test_run_help_lists_every_experiment_and_every_group_with_its_options(capsys) -> None:
    from repro.cli.commands import main
    from repro.common.configs import CONFIG_DIR

    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    folders = {path.parent for path in CONFIG_DIR.rglob("*.yaml") if path.parent != CONFIG_DIR}
    assert {"experiment", "harness", "serving", "hydra/launcher"} <= {f.relative_to(CONFIG_DIR).as_posix()
                                                                      for f in folders}
    for folder in folders:
        group = folder.relative_to(CONFIG_DIR).as_posix()
        listed = out.split("experiments (", 1)[1] if group == "experiment" else re.search(
            rf"^\s+{re.escape(group)}:.*(?:\n\s{{10,}}[^:\n]+)*", out, re.M).group(0)  # with its wrapped lines
        assert all(re.search(rf"\b{path.stem}\b", listed) for path in folder.glob("*.yaml")), group
    assert "mini_repro*" in out and re.search(r"^\s+serving:\s+cpu\*, endpoint, vllm$", out, re.M)


def _git_repo(path, *files: str) -> str:
    import subprocess

    for name in files:
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text("")
    run = lambda *args: subprocess.run(["git", *args], cwd=path, check=True, capture_output=True,  # noqa: E731
                                       text=True).stdout.strip()
    run("init", "-q")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "c")
    return run("rev-parse", "HEAD")


def test_the_manifest_records_the_checkouts_commit_and_none_for_an_installed_package(tmp_path) -> None:
    from repro.cli.runner import _git_sha

    checkout = tmp_path / "checkout"
    sha = _git_repo(checkout, "repro/__init__.py")
    assert _git_sha(checkout / "repro") == sha
    installed = checkout / ".venv/lib/python3/site-packages/repro"  # a wheel in a venv inside some project
    installed.mkdir(parents=True)
    assert _git_sha(installed) is None
    (tmp_path / "site-packages/repro").mkdir(parents=True)
    assert _git_sha(tmp_path / "site-packages/repro") is None  # no checkout at all


def test_a_run_on_another_split_is_named_for_it() -> None:
    """`tasks.split=validation` runs as `<experiment>_validation` (its own folder, table and eval name) unless named."""
    assert _composed(["experiment=mini_repro"])[".run.name"] == "mini_repro"
    validation = _composed(["experiment=mini_repro", "tasks.split=validation"])
    assert validation[".run.name"] == validation[".eval.experiment"] == "mini_repro_validation"
    assert _composed(["experiment=mini_repro", "tasks.split=validation", "run.name=mine"])[".run.name"] == "mine"

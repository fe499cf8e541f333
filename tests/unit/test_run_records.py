"""Run records (`repro.report.run_records`): the few KB of a run that `repro table` builds every table from, so that a
clone without the run directories rebuilds results/ byte for byte."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from repro.cli.runner import record_failure, run_configured
from repro.evaluation import EvalSpec, HarnessSpec, InstanceReport, SamplingSpec, TaskSetSpec, eval_metrics
from repro.evaluation import write_metrics as write_eval_metrics
from repro.report.run_records import RECORD_FILE, build_record, read_records, record_text, with_run_files
from repro.report.tables import find_metrics, write_kind_tables, write_tables

REPO_RESULTS = Path(__file__).resolve().parents[2] / "results"


def _seeded(seed: int, after_solved: int, n: int = 40) -> dict[str, Any]:
    """The metrics of a miniature run (kind ``before_after``) whose first ``after_solved`` of ``n`` instances go
    from unsolved to solved, with the fields its table rows, pooled row and diagnostics read."""
    ids = [f"t{i:03d}" for i in range(n)]
    before, after = dict.fromkeys(ids, 0.0), {t: float(j < after_solved) for j, t in enumerate(ids)}
    evals = {phase: {"pass_at_1": sum(v.values()) / n, "ci": {"low": 0.0, "high": 0.5}, "pass_at_k": {"1": 0.1}}
             for phase, v in (("before", before), ("after", after))}
    return {"kind": "before_after", "experiment": "mini_repro", "table": "mini_repro", "fingerprint": "abcdef0123",
            "task_distribution": "bundled:test", "train_tasks": "bundled:train", "seed": seed, **evals,
            "paired": {"n": n, "delta": after_solved / n, "delta_low": 0.0, "delta_high": 0.3, "mcnemar_p": 0.5,
                       "bootstrap_p": 0.4, "mde": 0.05},
            "samples": {"mode": "prefix_merge", "weighting": "rollout"}, "trainer": {"learning_rate": 5e-4},
            "rl": {"config": {"seed": seed, "steps": 3, "tasks_per_step": 2, "samples_per_task": 2}},
            "warm_start": {"key": "70f3833247a6eb42", "demo_rollouts": 30},
            "compute": {"phases": {"rl_rollouts": {"wall_s": 60.0}}, "total": {"cpu_core_h": 0.1}},
            "per_instance": {"before": before, "after": after},
            "diagnostics": [{"step": s, "reward_mean": 0.1 * s + 0.01 * seed, "mixed_group_share": 0.5,
                             "clip_fraction": 0.01, "entropy": 1.0 - 0.1 * s, "calls_per_rollout": 3.5,
                             "log_ratio_first_max": 2e-6, "log_ratio_max": 0.1} for s in range(3)]}


def _eval_run(run_dir: Path, solved: int, harness: str = "2.4.6", **extra: Any) -> None:
    """A frozen evaluation's run directory, written by the evaluation's own metrics code."""
    ids = [f"t{i}" for i in range(4)]
    spec = EvalSpec(HarnessSpec("mini-swe-agent", harness, {}), TaskSetSpec("bundled", ids, "ff"), SamplingSpec(), k=2)
    reports = [InstanceReport(t, s, f"{run_dir.name}-{t}-{s}", "resolved" if n < solved else "unresolved",
                              harness_status="finished", n_calls=2) for n, t in enumerate(ids) for s in range(2)]
    write_eval_metrics(run_dir, {**eval_metrics(reports, spec, "eval_tiny", "tiny@1", started_at=float(solved)),
                                 **extra})


def _table_outputs(outputs: Path) -> None:
    """An eval table's run and a two-cell harness sweep (each cell with its overrides)."""
    _eval_run(outputs / "eval_tiny" / "a", 2)
    for job, harness in enumerate(("2.4.6", "1.17.0")):
        _eval_run(outputs / "sweep" / "t" / str(job), job + 1, harness, table="harness_sweep", layout="matrix")
        (outputs / "sweep" / "t" / str(job) / "overrides.txt").write_text(f"experiment=harness_sweep\nharness={job}\n")


def _machine(cpu: str, kernel: str) -> dict[str, Any]:
    return {"cpu_model": cpu, "cpu_cores": 2, "cpu_cores_usable": 2, "arch": "x86_64",
            "isa": {"avx2": True, "avx512f": "EPYC" not in cpu, "avx512_bf16": False}, "kernel_release": kernel,
            "kernel_version": "#1 SMP", "python": "3.11.7"}


def _seed_run(run_dir: Path, seed: int, solved: int, machine: dict[str, Any] | None = None, epochs: int = 10,
              extra: tuple[str, ...] = ()) -> None:
    """A finished seed of the miniature, as a multirun job leaves it: metrics (absolute run_dir), the resolved
    config, overrides, manifest, and the big files a record must leave out."""
    run_dir.mkdir(parents=True)
    metrics = {**_seeded(seed, solved), "run_dir": str(run_dir.resolve()), "started_at": 100.0 + seed}
    if extra:  # an ablation (trainer.weighting=fragment)
        metrics["samples"] = {**metrics["samples"], "weighting": extra[0].rsplit("=", 1)[-1]}
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
    (run_dir / "overrides.txt").write_text("\n".join(["experiment=mini_repro", f"seed={seed}", *extra]) + "\n")
    (run_dir / "config.yaml").write_text(f"seed: {seed}\nrun:\n  output_root: {run_dir.parents[2]}\njob:\n"
                                         f"  model:\n    seed: {seed}\n  warm_start:\n    epochs: {epochs}\n")
    manifest = {"git_sha": "ab" * 20, "python": "3.11.7", "cpu_count": 2, "created_at": 1.0 + seed,
                "machine": machine or _machine("Intel(R) Xeon(R) Processor", "6.1.0")}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    (run_dir / "traces.sqlite").write_bytes(b"\x00" * 200_000)
    (run_dir / "policy").mkdir()
    (run_dir / "policy" / "model.safetensors").write_bytes(b"\x01" * 100_000)


def _outputs(root: Path) -> Path:
    """Run directories of an eval table, a harness sweep, a miniature sweep of three seeds (one of them another warm
    start: its config differs beyond the seed) with one failed job, and an ablation."""
    outputs = root / "outputs"
    _table_outputs(outputs)
    sweep = outputs / "mini_repro" / "20261201-153837"
    for seed, solved in enumerate((4, 8, 12)):
        _seed_run(sweep / str(seed), seed, solved, epochs=15 if seed == 2 else 10)
    _seed_run(outputs / "mini_repro" / "20261201-170000" / "0", 0, 2, extra=("trainer.weighting=fragment",))
    (sweep / "3").mkdir()
    record_failure(sweep / "3", ["experiment=mini_repro", "seed=3"], SystemExit("the probe kept 1 RL tasks"), job=3)
    return outputs


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _tables(folder: Path) -> dict[str, bytes]:
    return {name: data for name, data in _files(folder).items() if name.endswith((".md", ".csv"))}


def test_tables_from_records_equal_tables_from_the_run_directories(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the repository root, as when `repro table` runs
    outputs = _outputs(tmp_path)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for path, metrics in find_metrics(outputs):  # what `repro table` read before records: the run dirs' files
        by_kind.setdefault(metrics.get("kind", "unknown"), []).append(with_run_files(metrics, path.parent))
    from_dirs = _tables_of(write_kind_tables(by_kind, tmp_path / "from_dirs"), tmp_path / "from_dirs")

    write_tables(outputs, tmp_path / "published")  # records copied into published/runs
    shutil.copytree(tmp_path / "published" / "runs", tmp_path / "clone" / "runs")
    shutil.rmtree(outputs)  # the machine is gone: records only
    from_records = _tables_of(write_tables(tmp_path / "outputs", tmp_path / "clone"), tmp_path / "clone")
    assert set(from_dirs) == {"eval_tiny.md", "eval_tiny.csv", "harness_sweep.md", "harness_sweep.csv",
                              "mini_repro.md", "mini_repro.csv", "mini_repro_diagnostics.md",
                              "mini_repro_diagnostics.csv", "mini_repro_families.csv"}
    text = from_dirs["mini_repro.md"].decode()
    assert "pooled (2 seeds)" in text and "| trainer.weighting=fragment" in text
    assert "Command: `repro run -m experiment=harness_sweep harness=0,1`" in from_dirs["harness_sweep.md"].decode()
    for name, data in from_dirs.items():
        expected = data
        if name == "mini_repro.md":  # the failed job: listed by write_tables, which the run-dir build skips
            expected += b"\n## Runs that did not finish (no row above)\n\n- `outputs/mini_repro/20261201-153837/3` " \
                        b"(`experiment=mini_repro seed=3`): the probe kept 1 RL tasks\n"
        assert from_records[name] == expected, name


def _tables_of(written: list[Path], folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in written if p.suffix in (".md", ".csv") and p.parent == folder}


def test_a_fresh_clone_with_records_only_rebuilds_results_byte_for_byte(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    outputs = _outputs(tmp_path)
    first = write_tables(outputs, tmp_path / "results")
    published = _files(tmp_path / "results")
    assert {p.name for p in first} >= {"mini_repro.md", "mini_repro_diagnostics.svg", "eval_tiny.svg"}
    assert sorted(read_records(tmp_path / "results" / "runs")) == [
        "eval_tiny/a", "mini_repro/20261201-153837-0", "mini_repro/20261201-153837-1",
        "mini_repro/20261201-153837-2", "mini_repro/20261201-153837-3", "mini_repro/20261201-170000-0",
        "sweep/t-0", "sweep/t-1"]
    assert write_tables(outputs, tmp_path / "results") == first  # a run in outputs/ and in runs/ is one record
    assert _files(tmp_path / "results") == published

    clone = tmp_path / "clone"
    shutil.copytree(tmp_path / "results" / "runs", clone / "results" / "runs")
    monkeypatch.chdir(clone)
    assert [p.name for p in write_tables(Path("outputs"), Path("results"))] == [p.name for p in first]
    assert _files(clone / "results") == published  # tables, plots and records: the same bytes


def test_no_records_changes_nothing_under_the_published_results(tmp_path: Path, monkeypatch) -> None:
    """Today's tables were made from run directories that no machine holds: `repro table` leaves them alone."""
    shutil.copytree(REPO_RESULTS, tmp_path / "results", ignore=shutil.ignore_patterns("runs"))
    before = _files(tmp_path / "results")
    assert len(before) > 10
    monkeypatch.chdir(tmp_path)
    assert write_tables(tmp_path / "outputs", tmp_path / "results") == []
    assert _files(tmp_path / "results") == before
    assert not (tmp_path / "results" / "runs").exists()


def _realistic_run(run_dir: Path, n: int = 400) -> dict[str, Any]:
    """A miniature's metrics.json at the published size: 400 held-out tasks with ids as long as the bundled ones,
    each nested evaluation carrying its per-task results and spec."""
    ids = [f"repro-bundled__procedural-s0-test-fog.flax{i:03d}-comparison_flip-lc-{i * 2654435761 % 16**8:08x}"
           for i in range(n)]
    metrics = _seeded(0, n // 4, n)
    metrics["per_instance"] = {phase: {t: float(v) for t, v in zip(ids, values.values(), strict=True)}
                               for phase, values in metrics["per_instance"].items()}
    for phase in ("before", "after"):
        metrics[phase].update({"kind": "eval", "per_task": dict(metrics["per_instance"][phase]),
                               "spec": {"tasks": {"instance_ids": ids, "name": "bundled:test", "data_sha256": "f"}}})
    metrics["warm_start"]["path"] = str(Path.home() / ".cache" / "repro" / "warm_start" / "warm-1")
    _seed_run(run_dir, 0, 0)
    (run_dir / "metrics.json").write_text(json.dumps({**metrics, "run_dir": str(run_dir)}, indent=2))
    return metrics


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def test_a_record_names_no_machine_path_and_is_small(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    run_dir = outputs / "mini_repro" / "20261201-153837" / "0"
    metrics = _realistic_run(run_dir)
    record = build_record(run_dir, outputs)
    text = record_text(record)
    assert str(tmp_path) not in text and str(Path.home()) not in text
    assert not [s for s in _strings(record) if s.startswith("/")]
    assert record["run_dir"] == record["metrics"]["run_dir"] == "outputs/mini_repro/20261201-153837/0"
    assert record["config"]["run"]["output_root"] == "outputs"
    assert record["metrics"]["warm_start"]["path"] == "~/.cache/repro/warm_start/warm-1"
    assert record["machine"]["isa"] == {"avx2": True, "avx512f": True, "avx512_bf16": False}
    assert record["overrides"] == ["experiment=mini_repro", "seed=0"] and record["fingerprint"] == "abcdef0123"
    assert record["metrics"]["per_instance"] == metrics["per_instance"]  # pooled rows and paired tests need it
    assert "per_task" not in record["metrics"]["before"] and "before.per_task" in record["pruned"]
    # everything but the per-instance outcomes the tables need fits in a few KB; no trace or weight byte
    kept = len(json.dumps(metrics["per_instance"], indent=1))
    size = len(text.encode())
    assert size < kept + 8_000 < (run_dir / "metrics.json").stat().st_size / 2
    assert "\\u0000" not in text and "\\u0001" not in text


def test_records_of_two_machines_make_one_multi_seed_table(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    xeon, epyc = _machine("Intel(R) Xeon(R) Processor", "6.1.0"), _machine("AMD EPYC 7B13", "5.15.0-1057-gcp")
    _seed_run(tmp_path / "a" / "outputs" / "mini_repro" / "20261201-100000" / "0", 0, 4, xeon)
    for seed in (1, 2):
        _seed_run(tmp_path / "b" / "outputs" / "mini_repro" / "20261202-090000" / str(seed), seed, 4 * seed + 4, epyc)
    write_tables(tmp_path / "a" / "outputs", tmp_path / "results")  # published from machine a, then from b
    shutil.rmtree(tmp_path / "a")
    write_tables(tmp_path / "b" / "outputs", tmp_path / "results")
    records = read_records(tmp_path / "results" / "runs")
    assert {r["machine"]["cpu_model"] for r in records.values()} == {"Intel(R) Xeon(R) Processor", "AMD EPYC 7B13"}
    assert {r["machine"]["kernel_release"] for r in records.values()} == {"6.1.0", "5.15.0-1057-gcp"}
    md = (tmp_path / "results" / "mini_repro.md").read_text()
    pooled = next(line for line in md.splitlines() if "pooled (3 seeds)" in line)
    assert "| 0,1,2 " in pooled and "+20.0 [" in pooled  # mean gain (4 + 8 + 12) / 3 / 40, as on one machine
    assert "20261201-100000/0" in md and "20261202-090000/2" in md


def _finished_job(run_dir: Path) -> None:
    (run_dir / "metrics.json").write_text(json.dumps({"kind": "eval", "run_dir": str(run_dir), "pass_at_1": 1.0}))


def test_a_run_writes_its_record_when_it_finishes_and_when_it_fails(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = OmegaConf.create({"run": {"name": "x", "output_root": "outputs"},
                            "job": {"_target_": f"{__name__}._finished_job"}})
    run_dir = tmp_path / "outputs" / "x" / "20261201-100000"
    run_dir.mkdir(parents=True)
    run_configured(cfg, run_dir, ["experiment=x"])
    record = json.loads((run_dir / RECORD_FILE).read_text())
    assert record["metrics"]["pass_at_1"] == 1.0 and record["run_dir"] == "outputs/x/20261201-100000"
    assert record["overrides"] == ["experiment=x"] and record["machine"]["python"] and "isa" in record["machine"]
    assert record == build_record(run_dir, tmp_path / "outputs")  # what `repro table` copies

    failed = tmp_path / "outputs" / "x" / "20261201-110000"
    failed.mkdir()
    record_failure(failed, ["seed=1"], RuntimeError("boom"))
    record = json.loads((failed / RECORD_FILE).read_text())
    assert record["metrics"] is None and record["error"] == {"job": None, "overrides": ["seed=1"],
                                                             "error": "RuntimeError: boom"}


@pytest.mark.parametrize("name", ["outputs", "elsewhere/outputs"])
def test_a_run_outside_the_repository_is_named_under_its_outputs_root(tmp_path: Path, monkeypatch, name) -> None:
    (tmp_path / "repo").mkdir()
    monkeypatch.chdir(tmp_path / "repo")
    outputs = tmp_path / name
    _seed_run(outputs / "mini_repro" / "20261201-100000" / "0", 0, 4)
    record = build_record(outputs / "mini_repro" / "20261201-100000" / "0", outputs)
    assert record["run_dir"] == "outputs/mini_repro/20261201-100000/0"
    assert not [s for s in _strings(record) if s.startswith("/")]


def test_a_record_names_no_temporary_path_of_its_machine(tmp_path: Path) -> None:
    import tempfile

    from repro.report.run_records import path_roots, relative_paths

    excerpt = f"7 ({tempfile.gettempdir()}/repro-workspaces-abc/step_000--task/file.py"
    scrubbed = relative_paths({"fidelity": {"example": excerpt}}, path_roots(tmp_path / "outputs"))
    assert scrubbed == {"fidelity": {"example": "7 ($TMPDIR/repro-workspaces-abc/step_000--task/file.py"}}

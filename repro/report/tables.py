"""`repro table`: published tables in results/, built only from run records (``repro.report.run_records``).

`repro table` first copies the record of every run under ``outputs/`` that finished or failed to
``results/runs/<experiment>/<run-id>/record.json`` (a run seen in both places is one record, the one built from its
directory), then builds each table from the records under ``results/runs/`` alone, oldest run first (then by
record id): a clone with the records and no ``outputs/`` rebuilds the same bytes. A table with no record is not
touched (the published ones made before records existed stay as they are).

Each metrics.json names its ``kind``; :data:`WRITERS` names the module that writes each kind's tables: ``eval`` runs
become one table per comparison (``repro.report.eval_table``), ``proxy_overhead`` benchmark runs become
``proxy_overhead.md``, ``before_after`` runs (the miniature reproduction) one table per comparison
(``repro.report.before_after``), ``loop_comparison``, ``tokenizer_drift``, ``eval_docker``, ``engine_comparison``
and ``harness_matrix`` runs likewise (their modules of the same name; ``engines``). Unknown kinds are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from repro.report.before_after import write_before_after_tables
from repro.report.context_table import write_context_tables
from repro.report.context_training_table import write_context_training_tables
from repro.report.engines_table import write_engine_tables
from repro.report.eval_docker_table import write_eval_docker_tables
from repro.report.eval_table import write_eval_tables
from repro.report.harness_bench_table import write_harness_bench_tables
from repro.report.harness_matrix_table import write_harness_matrix_tables
from repro.report.jail_table import write_jail_overhead_tables
from repro.report.loop_comparison_table import write_loop_comparison_tables
from repro.report.protocol import count_split_use
from repro.report.run_records import failure_input, publish, read_records, records_of_outputs, table_input
from repro.report.table_files import source_line, write_newest_table
from repro.report.tokenizer_drift_table import write_tokenizer_drift_tables

RECORDS_DIR = "runs"  # results/runs/<experiment>/<run-id>/record.json

_TARGETS_NOTE = ("Targets (issue 2): proxy CPU <= 1 ms per non-streaming call and <= 1.5 ms per streaming call "
                 "while recording durably; at 64 concurrent rollouts on 2 cores, throughput >= 40% of direct.")


def find_metrics(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every ``metrics.json`` under ``root``, oldest first."""
    found = []
    for path in sorted(root.rglob("metrics.json")):
        try:
            found.append((path, json.loads(path.read_text())))
        except json.JSONDecodeError as exc:
            raise SystemExit(f"{path} is not valid JSON ({exc}); delete or fix that run") from None
    return sorted(found, key=lambda item: item[1].get("started_at", 0))


def find_failures(records: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The runs that failed (a record with an ``error`` and no metrics), per table (the experiment folder of the
    record id), each with its run directory (relative to the repository), in record-id order."""
    failures: dict[str, list[dict[str, Any]]] = {}
    for rid, record in sorted(records.items()):
        if record.get("metrics") is None and record.get("error") is not None:
            failures.setdefault(rid.split("/", 1)[0], []).append(failure_input(record))
    return failures


def finished_runs(records: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The table inputs of the finished runs among ``records`` per metrics ``kind``, oldest first, then by id."""
    finished = sorted((r["metrics"].get("started_at", 0), rid, r) for rid, r in records.items() if r.get("metrics"))
    by_kind: dict[str, list[dict[str, Any]]] = {}
    inputs = [table_input(record) for _, _, record in finished]
    count_split_use(inputs)
    for run in inputs:
        by_kind.setdefault(run.get("kind", "unknown"), []).append(run)
    return by_kind


def gather_records(outputs: Path, results: Path) -> dict[str, dict[str, Any]]:
    """Copy the record of every run under ``outputs`` into ``results/runs`` and return all records there."""
    root = results / RECORDS_DIR
    publish(records_of_outputs(outputs), root)
    return read_records(root)


def failures_section(records: list[dict[str, Any]]) -> str:
    """Markdown listing runs of a table that did not finish: they have no row, but they happened."""
    lines = ["", "## Runs that did not finish (no row above)", ""]
    lines += [f"- `{r['run_dir']}` (`{' '.join(r['overrides'])}`): {r['error']}" for r in records]
    return "\n".join(lines) + "\n"


def append_failures(written: list[Path], failures: dict[str, list[dict[str, Any]]]) -> None:
    """Add the failed runs of each table to its Markdown (a table with no finished run has no file to add to)."""
    for md in (p for p in written if p.suffix == ".md" and p.stem in failures):
        md.write_text(md.read_text() + failures_section(failures[md.stem]))


def proxy_overhead_frame(metrics: dict[str, Any]) -> pd.DataFrame:
    frame = pd.DataFrame(metrics["summary"])
    frame["mode"] = frame.pop("stream").map({True: "streaming", False: "non-streaming"})
    if "api" not in frame:
        frame["api"] = "chat"  # runs before the translated routes measured chat only
    columns = ["api", "mode", "concurrency", "proxy_cpu_ms_per_call", "added_p50_ms", "added_p99_ms", "direct_p50_ms",
               "proxy_p50_ms", "direct_rps", "proxy_rps", "throughput_ratio", "errors"]
    return frame[columns]


def proxy_overhead_markdown(runs: list[dict[str, Any]]) -> str:
    """Markdown for the newest proxy benchmark run, with its provenance."""
    metrics = runs[-1]
    frame = proxy_overhead_frame(metrics)
    cfg = metrics["config"]
    lines = [
        "# Proxy overhead",
        "",
        "Recording proxy vs direct calls to a fast fake upstream in the vLLM dialect, one interleaved run",
        f"(median of {cfg['repeats']} repeats of {cfg['calls_per_phase']} calls per phase; completion of "
        f"{cfg['completion_tokens']} tokens, one SSE chunk per token; ~{cfg['system_chars']}-char system prompt "
        f"plus a growing history; SQLite WAL synchronous={cfg['synchronous']}). Proxy CPU = user+system seconds "
        "of the proxy process (event loop + trace writer) per call. Load generator, proxy and upstream share "
        "the machine's cores. `api`: the route the load generator called on the proxy (chat completions, "
        "Anthropic Messages, OpenAI Responses; the last two translated to the upstream's chat completions, the "
        "direct phase sending the same conversation as chat).",
        "",
        _TARGETS_NOTE,
        "",
        frame.to_markdown(index=False, floatfmt=".3f"),
        "",
        source_line(metrics, "bench_proxy"),
    ]
    return "\n".join(lines) + "\n"


def write_tables(outputs: Path, results: Path) -> list[Path]:
    """Publish the records of the runs under ``outputs`` and regenerate every table that has records; returns the
    table files written (the records copied are under ``results/runs``)."""
    records = gather_records(outputs, results)
    written = write_kind_tables(finished_runs(records), results)
    append_failures(written, find_failures(records))
    return written


def write_proxy_overhead_tables(runs: list[dict[str, Any]], results: Path) -> list[Path]:
    """``results/proxy_overhead.md`` (the newest run, with its provenance) and ``.csv``."""
    return write_newest_table(runs, results, "proxy_overhead", proxy_overhead_markdown, proxy_overhead_frame)


# Each metrics ``kind`` with a table and what writes it from the kind's runs (table inputs, oldest first), in the
# order the tables are written.
WRITERS: dict[str, Callable[[list[dict[str, Any]], Path], list[Path]]] = {
    "proxy_overhead": write_proxy_overhead_tables,
    "eval": write_eval_tables,
    "before_after": write_before_after_tables,
    "loop_comparison": write_loop_comparison_tables,
    "tokenizer_drift": write_tokenizer_drift_tables,
    "eval_docker": write_eval_docker_tables,
    "engine_comparison": write_engine_tables,
    "harness_matrix": write_harness_matrix_tables,
    "jail_overhead": write_jail_overhead_tables,
    "harness_bench": write_harness_bench_tables,
    "context_profile": write_context_tables,
    "context_training": write_context_training_tables,
}


def write_kind_tables(by_kind: dict[str, list[dict[str, Any]]], results: Path) -> list[Path]:
    """Each kind's tables from its runs (table inputs, oldest first); returns the files written. Kinds without
    a writer are skipped."""
    results.mkdir(parents=True, exist_ok=True)
    return [path for kind, write in WRITERS.items() if kind in by_kind for path in write(by_kind[kind], results)]

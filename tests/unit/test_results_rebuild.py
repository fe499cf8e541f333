"""The committed ``results/`` is what ``repro table`` builds from the committed records alone: every table, CSV and
plot rebuilds byte for byte, and no published file lacks the records behind it (a table kept by hand, or a record
edited by hand after its table was built, fails here)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from repro.report.tables import RECORDS_DIR, write_tables

RESULTS = Path(__file__).parents[2] / "results"


def published_files(results: Path) -> dict[str, bytes]:
    """The tables, CSVs and plots of a results folder (the records under ``runs/`` are the input, not output)."""
    return {p.name: p.read_bytes() for p in results.iterdir() if p.is_file()}


def rebuilt_from_records(records: Path, tmp: Path) -> dict[str, bytes]:
    """``repro table`` on a folder holding only ``records``, with no run outputs."""
    results = tmp / "results"
    shutil.copytree(records, results / RECORDS_DIR)
    write_tables(tmp / "no-outputs", results)
    return published_files(results)


def differences(committed: dict[str, bytes], rebuilt: dict[str, bytes]) -> list[str]:
    """What tells the two apart: files only published (no record builds them), files only rebuilt, and files
    whose bytes differ."""
    out = [f"{name}: published, but no record builds it" for name in sorted(set(committed) - set(rebuilt))]
    out += [f"{name}: built from the records, but not published" for name in sorted(set(rebuilt) - set(committed))]
    out += [f"{name}: differs from its rebuild" for name in sorted(set(committed) & set(rebuilt))
            if committed[name] != rebuilt[name]]
    return out


def test_committed_results_rebuild_byte_for_byte_from_the_committed_records(tmp_path: Path) -> None:
    committed = published_files(RESULTS)
    assert any(name.endswith(".md") for name in committed)
    assert differences(committed, rebuilt_from_records(RESULTS / RECORDS_DIR, tmp_path)) == []


def test_the_check_sees_a_table_without_records_and_a_record_edited_by_hand(tmp_path: Path) -> None:
    """Controls: the comparison above fails on each of the two things it guards against."""
    committed = published_files(RESULTS)
    kept_by_hand = committed | {"kept_by_hand.md": b"# a table no record builds\n"}
    assert differences(kept_by_hand, committed) == ["kept_by_hand.md: published, but no record builds it"]

    records = tmp_path / "records"  # one table's records suffice to show an edit: rebuilt as-is and edited
    shutil.copytree(RESULTS / RECORDS_DIR / "mini_repro", records / "mini_repro")
    as_is = rebuilt_from_records(records, tmp_path / "as-is")
    (path,) = sorted(records.glob("mini_repro/*/record.json"))[:1]
    record = json.loads(path.read_text())
    record["metrics"]["paired"]["delta"] += 0.01  # a hand edit of one published number
    path.write_text(json.dumps(record))
    found = differences(as_is, rebuilt_from_records(records, tmp_path / "edited"))
    assert "mini_repro.md: differs from its rebuild" in found

"""`repro run experiment=tokenizer_drift` at a tiny size: the real mini-SWE-agent 2.4.6 with the tiny model on Qwen3's
exact tokenizer, warm-started on two expert demonstrations through the same harness (one SFT step), sampled at
temperature 1 through the recording proxy and the CPU server; the drift counts agree with the stored evaluation calls
(the demonstrations left out), the replay covers every policy turn, and `repro table` publishes the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repro.report.tables import write_tables
from repro.store import open_store
from tests.support import repro_cli

pytestmark = pytest.mark.e2e
pytest.importorskip("quicktok", reason="quicktok-v1 missing: pip install -e '.[qwen3-tokenizer]'")


def test_drift_of_mini_swe_agent_on_qwen3s_tokenizer(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    proc = repro_cli("run", "experiment=tokenizer_drift", "tasks.n_tasks=2", "eval.k=1", "eval.max_tokens=24",
                     "warm_start.n_demo_tasks=2", "warm_start.sft.epochs=1", "warm_start.sft.batch_size=2",
                     "warm_start.use_cache=false", f"run.output_root={out}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    (path,) = out.glob("tokenizer_drift/*/metrics.json")
    metrics = json.loads(path.read_text())
    assert metrics["kind"] == "tokenizer_drift" and metrics["harness"] == "mini-swe-agent@2.4.6"
    assert metrics["tokenizer"] == "qwen3" and metrics["temperature"] == 1.0
    warm = metrics["warm_start"]
    assert warm["demo_rollouts"] == 2 and warm["sft"]["steps"] == 1 and metrics["model"] == Path(warm["path"]).name
    store = open_store(path.parent / "traces.sqlite")
    modes = [r.mode for r in store.list_rollouts()]
    calls = [c for r in store.list_rollouts() if r.mode == "eval" for c in store.calls(r.rollout_id)]
    store.close()
    assert sorted(modes) == ["demo", "demo", "eval", "eval"]
    policy = [c for c in calls if c.purpose == "policy" and c.completion_ids]
    assert metrics["rollouts"] == 2 and metrics["calls"] == len(calls) >= 2
    assert metrics["prefix_drift_all"]["n"] == len(policy) - 2  # every call after each rollout's first
    assert metrics["retokenization_all"]["n"] == len(policy)  # 24 sampled tokens each: never only the end token
    assert metrics["replay"]["turns"] == len(policy)
    assert max(len(c.completion_ids) for c in policy) <= 24
    written = write_tables(out, tmp_path / "results")
    assert {p.name for p in written} == {"fidelity_real_tokenizer.md", "fidelity_real_tokenizer.csv"}
    assert "mini-swe-agent@2.4.6" in (tmp_path / "results" / "fidelity_real_tokenizer.md").read_text()

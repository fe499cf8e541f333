"""The plan a job prints at its start: every phase with its expected duration, from this machine's rates or the
reference machine's when it has none."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.utils import instantiate

from repro.cli.runner import compose_config
from repro.common import eta
from repro.recipe.miniature import ArmConfig, miniature_phases
from repro.train.sft import sft_steps


@pytest.fixture(autouse=True)
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path))


def _default_phases(overrides: list[str]) -> list[tuple[str, str, float]]:
    job = compose_config(["experiment=mini_repro", *overrides]).job
    get = {k: instantiate(job[k], _convert_="all") for k in ("miniature", "loop", "rl")}
    return miniature_phases(get["miniature"], ArmConfig(get["loop"], get["rl"]))


def test_the_default_miniature_plans_every_phase_with_its_units() -> None:
    phases = {name: (kind, units) for name, kind, units in _default_phases([])}
    job = compose_config(["experiment=mini_repro"]).job
    ws, ev, rl, flt = job.miniature.warm_start, job.miniature.eval, job.rl.schedule, job.rl.task_filter
    assert phases["warm_start_demos"] == ("demo", ws.n_demo_tasks)
    assert phases["eval_before"] == phases["eval_after"] == ("eval_sample", job.miniature.tasks.n_tasks * ev.k)
    assert phases["rl (proxy loop)"] == ("rl_rollout_proxy", rl.steps * rl.tasks_per_step * rl.samples_per_task)
    assert not flt.enabled and "probe" not in phases  # the default draws RL tasks without the filter (issue 53)
    filtered = {name: (kind, units) for name, kind, units in _default_phases(["rl_filter.enabled=true"])}
    assert filtered["probe"] == ("probe_sample", flt.pool * flt.k)
    planned = sft_steps(instantiate(ws.sft), ws.n_demo_tasks)
    gated = (f"warm_start_sft (the decay waits for {ws.sft.decay_at_reproduced:.0%} of held-out later actions "
             f"reproduced: at most {2 * planned} steps)")
    assert ws.sft.decay_at_reproduced > 0 and ws.sft.max_steps_factor == 2.0
    assert phases[gated] == ("sft_step", 2 * planned)  # planned at the cap, where every measured seed ended
    fixed = {n: (k, u) for n, k, u in _default_phases(["warm_start.sft.decay_at_reproduced=0"])}
    assert fixed["warm_start_sft"] == ("sft_step", planned)


def test_a_fresh_machine_estimates_from_the_reference_rates_and_then_from_its_own() -> None:
    text = eta.plan_text([("eval_before", "eval_sample", 100), ("odd", "unknown_kind", 3)])
    assert f"~{eta.duration(eta.REFERENCE_RATES['eval_sample'] * 100)}" in text and "reference" in text
    assert "odd: 3 x unknown_kind (no estimate)" in text and "total: ~" in text
    eta.record("eval_sample", 100, 200.0)  # this machine ran it: 2 s a sample
    assert "eval_before: 100 x eval_sample (~3m 20s, from this machine's last run)" in eta.plan_text(
        [("eval_before", "eval_sample", 100)])


def test_a_phase_of_few_units_or_seconds_records_no_rate() -> None:
    eta.record("demo", 8, 370.0)  # a test's miniature: start-up cost, not a rate (46 s a demonstration)
    eta.record("demo", 3000, 30.0)  # too short to tell start-up from work
    assert eta.rate_of("demo") == (eta.REFERENCE_RATES["demo"], "on the reference 2-core machine")
    eta.record("demo", 3000, 210.0)
    assert eta.rate_of("demo") == (0.07, "from this machine's last run")

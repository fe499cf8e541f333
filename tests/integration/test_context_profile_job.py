"""``experiment=context_profile`` end to end at its smallest: mini-SWE-agent 2.4.6 (no compaction), two tasks, with
room and then on a window with no headroom past its first prompt and ``max_tokens``: with room nothing is refused;
on the tight window the second call is, and every rollout ends with the ``context_exceeded`` outcome."""

from __future__ import annotations

from pathlib import Path

from repro.experiments.context_profile import ContextProfileConfig, context_profile_job


def test_a_window_without_headroom_ends_every_rollout_on_a_refusal(tmp_path: Path) -> None:
    cfg = ContextProfileConfig(arms=[{"label": "mini-SWE-agent", "harness": "mini-swe-agent"}], headrooms=[0],
                               n_tasks=2, concurrency=1)
    metrics = context_profile_job(cfg, tmp_path)
    (arm,) = metrics["arms"]
    roomy, tight = arm["windows"]
    assert roomy["window"] is None and roomy["calls_mean"] == 3 and roomy["pass_at_1"] == 1.0
    assert (roomy["refused"], roomy["context_exceeded"], roomy["rows_max"]) == (0.0, 0.0, 1)
    assert tight["window"] == roomy["first_prompt_max"] + cfg.max_tokens
    assert (tight["refused"], tight["context_exceeded"], tight["pass_at_1"]) == (1.0, 1.0, 0.0)
    assert tight["infra_failures"] == 0 and (tmp_path / "metrics.json").exists()

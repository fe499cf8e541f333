"""The full-scale job (experiment=rl_run; agl_swebench_qwen35_9b is the same job at scale) at toy size on CPU, in one
run: the real harness through the proxy and the CPU server, frozen evaluation before and after, 3 RL steps in
one-step-off mode (the next step's rollouts run during this step's update), a validation point before RL and every
2 steps, a shaped reward (a prompt-length penalty, which spares the unsolved rollouts the random tiny model makes:
each step's recorded mean is exactly 0.0, beside its resolved share), the policy version of every call, and the cost
the runner adds from the configured prices. (The random tiny model's rollouts of one task are alike, so its groups
carry no advantage; the miniature's tests are the ones that show updates.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repro.cli.commands import main
from repro.report.before_after import run_markdown


@pytest.mark.e2e
def test_rl_run_evaluates_trains_off_by_one_with_a_shaped_reward_and_validates(tmp_path: Path) -> None:
    main(["run", "experiment=rl_run", "rl.steps=3", "rl.mode=one_step_off", "trainer.on_policy_log_ratio_max=0",
          "validation.every_steps=2",
          "validation.before_first_step=true", "rl.reward.prompt_penalty=0.5", "rl.reward.prompt_penalty_from=50",
          "rl.reward.prompt_penalty_to=3000", "pricing.per_cpu_core_hour=0.05", f"run.output_root={tmp_path}"])
    (metrics_path,) = tmp_path.glob("rl_run/*/metrics.json")
    metrics = json.loads(metrics_path.read_text())
    assert metrics["kind"] == "before_after" and metrics["before"]["n_samples"] == metrics["after"]["n_samples"] == 4
    assert metrics["before"]["fingerprint"] == metrics["after"]["fingerprint"]  # one frozen spec
    history = metrics["rl"]["history"]
    assert [h["step"] for h in history] == [0, 1, 2]
    # shaped (resolved_share is recorded only then), and the penalty applies to solved rollouts only
    assert all(h["reward_mean"] == 0.0 and h["resolved_share"] == 0 for h in history)
    assert all(h["update"]["rows"] > 0 for h in history)  # the calls became rows

    # policy versions: step 0 by the base weights; later steps started during the previous update, so their calls
    # are served by the weights of step - 1 (stale) until the sync, then by those of step
    assert set(history[0]["policy_versions"]) == {"0"} and history[0]["stale_calls"] == 0
    for h in history[1:]:
        assert set(h["policy_versions"]) <= {str(h["step"] - 1), str(h["step"])}
        assert h["stale_calls"] == h["policy_versions"].get(str(h["step"] - 1), 0)
    assert sum(h["stale_calls"] for h in history[1:]) > 0  # the next step's first calls precede the update's end

    first, point = metrics["validation"]  # the starting policy, then every 2 steps: after the second step only
    assert first["step"] == -1 and first["n"] == 4
    assert point["step"] == 1 and point["n"] == 4 and 0.0 <= point["pass_at_1"] <= 1.0
    assert (metrics_path.parent / "validation" / "before_rl").is_dir()
    assert (metrics_path.parent / "validation" / "step_001").is_dir()
    assert "validation" in metrics["compute"]["phases"]
    cpu_h = metrics["compute"]["total"]["cpu_core_h"]  # priced by the runner after the job (pricing.*)
    assert metrics["cost"]["amount"] == pytest.approx(0.05 * cpu_h) and metrics["cost"]["currency"] == "USD"
    assert "| cost" in run_markdown([metrics])

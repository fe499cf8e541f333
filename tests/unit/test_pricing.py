"""GPU-hours into money (repro.common.pricing): the configured price of the run's GPU (exact name, else the longest part
of it), CPU core-hours at their price, no guessed price for an unknown GPU, and the runner's post-step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from repro.cli.runner import add_cost
from repro.common.pricing import PricingConfig, cost_cell, gpu_price, price_metrics, run_cost


def compute(gpu_h: float, cpu_h: float, gpus: list[str]) -> dict:
    return {"total": {"gpu_h_allocated": gpu_h, "cpu_core_h": cpu_h}, "hardware": {"gpus": gpus}}


def test_the_run_gpu_is_priced_by_exact_name_then_by_the_longest_matching_part() -> None:
    prices = {"H100": 2.0, "H100 80GB HBM3": 3.0, "NVIDIA B200": 6.0}
    assert gpu_price(["NVIDIA H100 80GB HBM3"], prices) == ("H100 80GB HBM3", 3.0)
    assert gpu_price(["NVIDIA B200"], prices) == ("NVIDIA B200", 6.0)
    assert gpu_price(["NVIDIA A100-SXM4-80GB"], prices) is None
    assert gpu_price([], prices) is None


def test_cost_of_gpu_and_cpu_hours() -> None:
    pricing = PricingConfig(per_gpu_hour={"B200": 5.0}, per_cpu_core_hour=0.05)
    cost = run_cost(compute(10.0, 100.0, ["NVIDIA B200"] * 4), pricing)
    assert cost["amount"] == pytest.approx(10 * 5.0 + 100 * 0.05) and cost["gpu"] == "B200"
    cpu_only = run_cost(compute(0.0, 2.0, []), pricing)
    assert cpu_only["amount"] == pytest.approx(0.1)
    unpriced = run_cost(compute(1.0, 0.0, ["NVIDIA L4"]), pricing)
    assert unpriced["amount"] is None and "NVIDIA L4" in unpriced["unpriced"]


def test_a_comparison_adds_up_its_arms_and_an_unpriced_part_leaves_the_total_unset() -> None:
    pricing = PricingConfig(per_gpu_hour={"B200": 5.0})
    metrics = {"compute": compute(1.0, 0.0, ["B200"]), "arms": {"proxy": {"compute": compute(2.0, 0.0, ["B200"])},
                                                              "rebuilt": {"compute": compute(3.0, 0.0, ["B200"])}}}
    assert price_metrics(metrics, pricing)["amount"] == pytest.approx(30.0)
    metrics["arms"]["rebuilt"]["compute"] = compute(3.0, 0.0, ["L4"])
    assert price_metrics(metrics, pricing)["amount"] is None
    assert price_metrics(metrics, PricingConfig()) is None  # no prices: no cost at all
    assert cost_cell({}) == "-" and cost_cell({"cost": {"amount": None}}) == "unpriced"
    assert cost_cell({"cost": {"amount": 30.0, "currency": "EUR"}}) == "30 EUR"


def test_the_runner_adds_the_cost_to_metrics(tmp_path: Path) -> None:
    (tmp_path / "metrics.json").write_text(json.dumps({"kind": "eval", "compute": compute(2.0, 4.0, ["NVIDIA H200"])}))
    add_cost(tmp_path, OmegaConf.create({"per_gpu_hour": {}, "per_cpu_core_hour": 0.0, "currency": "USD"}))
    assert "cost" not in json.loads((tmp_path / "metrics.json").read_text())
    add_cost(tmp_path, OmegaConf.create({"per_gpu_hour": {"H200": 4.0}, "per_cpu_core_hour": 0.0, "currency": "USD"}))
    assert json.loads((tmp_path / "metrics.json").read_text())["cost"]["amount"] == pytest.approx(8.0)
    add_cost(tmp_path / "missing", OmegaConf.create({"per_gpu_hour": {"H200": 4.0}}))  # no metrics: nothing

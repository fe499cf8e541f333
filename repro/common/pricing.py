"""Turning a run's hours into money: a price table in config (``pricing``), applied to ``metrics.json``'s compute.

repro ships no prices (they differ by provider, contract and month): ``pricing.per_gpu_hour`` maps a GPU name, or
a part of one (``B200`` matches ``NVIDIA B200``), to a price per allocated GPU-hour; ``per_cpu_core_hour`` prices
CPU core-hours. After a job, the runner adds ``metrics["cost"]`` (amount, currency, what was priced and at what);
tables show it. A GPU with no price leaves the amount unset rather than guessing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PricingConfig:
    per_gpu_hour: dict[str, float] = field(default_factory=dict)
    per_cpu_core_hour: float = 0.0
    currency: str = "USD"

    @property
    def empty(self) -> bool:
        return not self.per_gpu_hour and not self.per_cpu_core_hour


def gpu_price(names: list[str], prices: dict[str, float]) -> tuple[str, float] | None:
    """(the table's key, its price) for the run's GPU: an exact name first, then the longest key inside it."""
    if not names:
        return None
    name = names[0]
    if name in prices:
        return name, float(prices[name])
    inside = sorted((k for k in prices if k.lower() in name.lower()), key=len, reverse=True)
    return (inside[0], float(prices[inside[0]])) if inside else None


def compute_blocks(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """Every ``compute`` block of a run's metrics (the run's own, and each arm's in a comparison)."""
    blocks = [metrics["compute"]] if isinstance(metrics.get("compute"), dict) else []
    for arm in (metrics.get("arms") or {}).values() if isinstance(metrics.get("arms"), dict) else []:
        if isinstance(arm, dict) and isinstance(arm.get("compute"), dict):
            blocks.append(arm["compute"])
    return blocks


def run_cost(compute: dict[str, Any], pricing: PricingConfig) -> dict[str, Any]:
    """The cost of one compute block under ``pricing`` (``amount`` None when its GPU has no price)."""
    total = compute.get("total") or {}
    gpu_h, cpu_h = float(total.get("gpu_h_allocated") or 0.0), float(total.get("cpu_core_h") or 0.0)
    gpus = (compute.get("hardware") or {}).get("gpus") or []
    out: dict[str, Any] = {"currency": pricing.currency, "gpu_h": gpu_h, "cpu_core_h": cpu_h,
                           "cpu_core_hour_price": pricing.per_cpu_core_hour}
    amount = cpu_h * pricing.per_cpu_core_hour
    if gpu_h > 0:
        found = gpu_price(gpus, pricing.per_gpu_hour)
        if found is None:
            return {**out, "amount": None, "unpriced": f"no price for GPU {gpus[0] if gpus else '(unnamed)'} in "
                                                      "pricing.per_gpu_hour"}
        out["gpu"], out["gpu_hour_price"] = found
        amount += gpu_h * found[1]
    return {**out, "amount": amount}


def price_metrics(metrics: dict[str, Any], pricing: PricingConfig) -> dict[str, Any] | None:
    """``metrics["cost"]`` for the run (all its compute blocks added up), or None with no prices configured."""
    if pricing.empty:
        return None
    parts = [run_cost(block, pricing) for block in compute_blocks(metrics)]
    if not parts:
        return None
    amounts = [p["amount"] for p in parts]
    return {"currency": pricing.currency, "amount": None if None in amounts else sum(amounts), "parts": parts}


def cost_cell(metrics: dict[str, Any]) -> str:
    """A table cell: ``12.4 USD``, ``-`` without prices, ``unpriced`` when a GPU had none."""
    cost = metrics.get("cost")
    if not cost:
        return "-"
    return "unpriced" if cost["amount"] is None else f"{cost['amount']:.3g} {cost['currency']}"

"""Paired comparison of two runs on the same instances: exact McNemar test and a paired bootstrap.

Pairing by instance removes the between-task variance that dominates unpaired intervals: two models that
differ by a few points on the same 500 tasks can be told apart when their separate intervals overlap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np


def align(a: Mapping[str, float], b: Mapping[str, float], allow_subset: bool = False) -> list[str]:
    """The instance ids both runs scored, sorted; differing sets are an error unless ``allow_subset``."""
    common = sorted(set(a) & set(b))
    if not allow_subset and (len(common) != len(a) or len(common) != len(b)):
        raise ValueError(f"runs scored different instances ({len(a)} vs {len(b)}, {len(common)} in common); "
                         "a paired test needs the same instances (pass allow_subset=True to use the common ones)")
    if not common:
        raise ValueError("the two runs share no instance")
    return common


@dataclass
class McNemarResult:
    """``only_a``: instances A solved and B did not; ``only_b``: the reverse. Two-sided exact p-value."""

    only_a: int
    only_b: int
    n: int
    p_value: float


def mcnemar_exact(a: Mapping[str, bool], b: Mapping[str, bool], allow_subset: bool = False) -> McNemarResult:
    """Exact (binomial) McNemar test on per-instance solved/unsolved outcomes of two runs."""
    ids = align(a, b, allow_subset)
    only_a = sum(1 for i in ids if a[i] and not b[i])
    only_b = sum(1 for i in ids if b[i] and not a[i])
    m = only_a + only_b
    if m == 0:
        return McNemarResult(only_a, only_b, len(ids), 1.0)
    tail = sum(math.comb(m, i) for i in range(min(only_a, only_b) + 1)) / 2**m
    return McNemarResult(only_a, only_b, len(ids), min(1.0, 2 * tail))


@dataclass
class PairedBootstrapResult:
    """Mean of ``b - a`` over instances and its percentile interval (no p-value: the share of resampled means on
    the far side of 0 is not one; the sign-flip test gives the p)."""

    diff: float
    low: float
    high: float
    n: int


def paired_bootstrap(a: Mapping[str, float], b: Mapping[str, float], confidence: float = 0.95,
                     resamples: int = 5000, seed: int = 0, allow_subset: bool = False) -> PairedBootstrapResult:
    """Resample instances (the same draw for both runs) and look at the mean per-instance difference."""
    ids = align(a, b, allow_subset)
    diffs = np.array([b[i] - a[i] for i in ids], dtype=float)
    rng = np.random.default_rng(seed)
    means = diffs[rng.integers(0, diffs.size, size=(resamples, diffs.size))].mean(axis=1)
    alpha = (1 - confidence) / 2
    return PairedBootstrapResult(float(diffs.mean()), float(np.quantile(means, alpha)),
                                 float(np.quantile(means, 1 - alpha)), len(ids))


@dataclass
class SignFlipResult:
    """Mean of ``b - a`` over instances and the two-sided p-value of the paired sign-flip (permutation) test."""

    diff: float
    p_value: float
    n: int


def sign_flip_test(a: Mapping[str, float], b: Mapping[str, float], resamples: int = 20000, seed: int = 0,
                   allow_subset: bool = False) -> SignFlipResult:
    """Paired randomization test: under H0 each instance's difference is as likely negated, so the p-value is the
    share of random sign flips whose mean is at least as far from 0 as the observed one (+1 smoothing). Valid for
    per-instance means over k samples, where McNemar (binary outcomes) is not."""
    ids = align(a, b, allow_subset)
    diffs = np.array([b[i] - a[i] for i in ids], dtype=float)
    observed = abs(diffs.mean())
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(resamples, diffs.size))
    extreme = int(np.sum(np.abs((signs * diffs).mean(axis=1)) >= observed - 1e-12))
    return SignFlipResult(float(diffs.mean()), (extreme + 1) / (resamples + 1), len(ids))


def minimum_detectable_effect(a: Mapping[str, float], b: Mapping[str, float], alpha: float = 0.05,
                              power: float = 0.8, allow_subset: bool = False) -> float:
    """The smallest true mean difference a paired two-sided test at ``alpha`` detects with probability ``power``,
    given these instances: ``(z(1 - alpha/2) + z(power)) * sd(b - a) / sqrt(n)`` with the observed per-instance
    differences' standard deviation (normal approximation; 0 when fewer than 2 instances)."""
    ids = align(a, b, allow_subset)
    if len(ids) < 2:
        return 0.0
    diffs = np.array([b[i] - a[i] for i in ids], dtype=float)
    z = NormalDist()
    return float((z.inv_cdf(1 - alpha / 2) + z.inv_cdf(power)) * diffs.std(ddof=1) / np.sqrt(len(ids)))


SIGN_FLIP_RESAMPLES = 20000


def paired_summary(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float | int]:
    """``b - a`` over instances: mean (``delta``), bootstrap interval, sign-flip p (with its resample count: the p
    cannot go below ``1 / (resamples + 1)``), minimum detectable effect (alpha 0.05, power 0.8) and ``n``: what a
    results table prints for a paired comparison."""
    boot = paired_bootstrap(a, b)
    flip = sign_flip_test(a, b, resamples=SIGN_FLIP_RESAMPLES)
    return {"n": boot.n, "delta": boot.diff, "delta_low": boot.low, "delta_high": boot.high,
            "sign_flip_p": flip.p_value, "sign_flip_resamples": SIGN_FLIP_RESAMPLES,
            "mde": minimum_detectable_effect(a, b)}


def across_seeds(deltas: list[float], confidence: float = 0.95) -> dict[str, float] | None:
    """The training seeds as the random factor: the mean of the seeds' own deltas, its t interval (n - 1 degrees
    of freedom) and the two-sided one-sample t-test p against 0; None for fewer than two seeds. With three seeds
    this is wide: it is the interval a reader who asks "would another seed give the same?" needs beside the
    instance-level one."""
    if len(deltas) < 2:
        return None
    from scipy import stats  # imported on use: only tables of several seeds need it

    values = np.asarray(deltas, dtype=float)
    mean, sem = float(values.mean()), float(values.std(ddof=1) / np.sqrt(values.size))
    if sem == 0:
        return {"mean": mean, "low": mean, "high": mean, "p": 1.0 if mean == 0 else 0.0, "n": int(values.size)}
    half = float(stats.t.ppf(0.5 + confidence / 2, values.size - 1)) * sem
    p = float(2 * stats.t.sf(abs(mean) / sem, values.size - 1))
    return {"mean": mean, "low": mean - half, "high": mean + half, "p": p, "n": int(values.size)}

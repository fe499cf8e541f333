"""statlite: small descriptive statistics and number helpers."""

from statlite.core import (
    clamp,
    cumulative_sum,
    histogram,
    mean,
    median,
    mode,
    moving_average,
    normalize,
    percentile,
    stdev,
    variance,
    weighted_mean,
    zscores,
)

__all__ = [
    "clamp",
    "cumulative_sum",
    "histogram",
    "mean",
    "median",
    "mode",
    "moving_average",
    "normalize",
    "percentile",
    "stdev",
    "variance",
    "weighted_mean",
    "zscores",
]

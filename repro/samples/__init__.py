"""Stored rollouts -> training rows (the unit the RL trainer trains on): fragments, weights, advantages."""

from repro.samples.advantages import SCALES, advantages, group_advantages, group_key, masked_reason
from repro.samples.build import (
    RolloutSamples,
    Row,
    SampleConfig,
    SampleSet,
    build_rows,
    build_sample_set,
    group_sample_set,
    rollout_samples,
)
from repro.samples.rows import MODES, Fragment, SkippedCall, fragments
from repro.samples.weights import WEIGHTINGS, row_weights

__all__ = [
    "MODES",
    "SCALES",
    "WEIGHTINGS",
    "Fragment",
    "RolloutSamples",
    "Row",
    "SampleConfig",
    "SampleSet",
    "SkippedCall",
    "advantages",
    "build_rows",
    "build_sample_set",
    "fragments",
    "group_advantages",
    "group_key",
    "group_sample_set",
    "masked_reason",
    "rollout_samples",
    "row_weights",
]

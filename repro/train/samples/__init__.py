"""Stored rollouts -> training rows (the unit the RL trainer trains on): ``rows`` (calls -> fragments -> row
weights -> GRPO advantages, and :class:`SampleConfig`), ``build`` (``build_rows`` / :class:`SampleSet` from a
store, and the inspect view). Neither imports the store or numpy at import time: the CLI's parser reads
``MODES``, ``WEIGHTINGS`` and the :class:`SampleConfig` defaults."""

from repro.train.samples.build import (
    RolloutSamples,
    Row,
    SampleSet,
    build_rows,
    build_sample_set,
    group_sample_set,
    rollout_samples,
    rows_view,
)
from repro.train.samples.rows import (
    MODES,
    SCALES,
    WEIGHTINGS,
    Fragment,
    SampleConfig,
    SkippedCall,
    advantages,
    fragments,
    group_advantages,
    group_key,
    masked_reason,
    row_weights,
)

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
    "rows_view",
]

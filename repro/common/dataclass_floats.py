"""Float-annotated dataclass fields stored as floats, so a setting's value, not how it was typed, enters a hash or a
cache key (``temperature=1`` and ``1.0``, ``decay_at_loss=0`` and ``0.0`` on the command line hash alike)."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any


def coerce_floats(obj: Any, require_finite: bool = False) -> None:
    """Store each number in a float-annotated field of the dataclass ``obj`` (frozen or not) as a float; with
    ``require_finite``, a NaN or infinite one is a ``ValueError`` naming the field."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if "float" in str(f.type) and isinstance(value, int | float) and not isinstance(value, bool):
            if require_finite and not math.isfinite(value):
                raise ValueError(f"{type(obj).__name__}.{f.name} must be finite, got {value}")
            object.__setattr__(obj, f.name, float(value))

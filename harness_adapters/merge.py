"""Settings files built in layers (a harness's defaults, then the user's overrides): one deep merge for every
adapter that writes one (mini-SWE-agent 1.x's YAML, OpenCode's ``opencode.json``, Qwen Code's ``settings.json``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def merge_configs(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Merge config dicts, later layers winning: nested mappings merge key by key, anything else replaces."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            old = merged.get(key)
            merged[key] = merge_configs(old, value) if isinstance(old, Mapping) and isinstance(value, Mapping) \
                else value
    return merged

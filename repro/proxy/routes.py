"""URL helpers for the proxy's routes (what a harness adapter points its side calls at)."""

from __future__ import annotations

PURPOSE_SEGMENT = "purpose"


def rollout_base_path(rollout_id: str, capability: str) -> str:
    """``/rollouts/<id>/<capability>/v1``: the path of a rollout's model routes (what the harness is given, under
    the proxy's URL; :func:`repro.proxy.auth.capability` derives the capability)."""
    return f"/rollouts/{rollout_id}/{capability}/v1"


def purpose_base_url(base_url: str, purpose: str) -> str:
    """``.../rollouts/<id>/v1`` -> ``.../rollouts/<id>/purpose/<purpose>/v1``: calls sent there are recorded under
    the same rollout with ``purpose`` (e.g. ``auxiliary`` for OpenCode's title request, ``summary`` for a
    condenser's call), so the sample builder can tell them from the agent's own calls."""
    check_purpose(purpose)
    root = base_url.rstrip("/")
    if not root.endswith("/v1") or "/rollouts/" not in root:
        raise ValueError(f"not a rollout base URL (…/rollouts/<id>/v1): {base_url!r}")
    return f"{root[: -len('/v1')]}/{PURPOSE_SEGMENT}/{purpose}/v1"


def check_purpose(purpose: str) -> str:
    """``purpose`` if it is one of CALL_PURPOSES, else ValueError naming the choices."""
    from repro.store.trace_records import CALL_PURPOSES  # here: the store's package imports numpy, --help need not

    if purpose not in CALL_PURPOSES:
        raise ValueError(f"unknown call purpose {purpose!r}; known: {', '.join(CALL_PURPOSES)}")
    return purpose

"""Sampling seeds that make every rollout an independent draw, and identical reruns identical.

A seed is a hash of everything that names the draw: a stream (``eval``, ``rl``, ``call``), the base seed, and the
rollout's coordinates (RL step, instance id, sample index). Two tasks never share a seed, so the same sample index
of two tasks does not reuse the same random numbers (with ``base + sample`` they did: the CPU engine draws with one
generator per request, so position t of every task's completion got the same noise). Streams keep evaluation and
training draws disjoint. Within a rollout, each call gets its own seed derived from the rollout's and its
sequence number (:func:`call_seed`), so a rollout's later calls do not replay its first call's noise either.
"""

from __future__ import annotations

import hashlib
import json

SEED_BITS = 62  # leaves room for the server's per-row offset (seed + index) inside a signed 64-bit integer


def derive_seed(stream: str, *parts: int | str) -> int:
    """A ``SEED_BITS``-bit seed from sha256 of ``[stream, *parts]`` (canonical JSON)."""
    payload = json.dumps([stream, *parts], separators=(",", ":"), ensure_ascii=False).encode()
    return int.from_bytes(hashlib.sha256(payload).digest()[:8], "big") >> (64 - SEED_BITS)


def eval_seed(base: int, instance_id: str, sample: int) -> int:
    """The seed of a frozen evaluation's ``sample``-th rollout of ``instance_id``."""
    return derive_seed("eval", base, instance_id, sample)


def rl_seed(base: int, step: int, instance_id: str, sample: int) -> int:
    """The seed of an RL rollout: one stream per (training seed, step), disjoint from evaluation's."""
    return derive_seed("rl", base, step, instance_id, sample)


def call_seed(rollout_seed: int, seq: int) -> int:
    """The seed the proxy sends for the ``seq``-th call of a rollout seeded ``rollout_seed``."""
    return derive_seed("call", rollout_seed, seq)

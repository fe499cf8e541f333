"""The frozen evaluation spec: every condition an evaluation number depends on, except the model evaluated.

Two runs are one comparison only if their specs have the same :meth:`EvalSpec.fingerprint`. The model
(checkpoint) is deliberately *not* part of the spec: comparing models under identical conditions is the point.
The fingerprint is the sha256 of the spec's canonical JSON (sorted keys, no whitespace, no NaN), so it does not
depend on dict ordering, and instance ids are a sorted set, so neither does the order tasks were listed in.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from repro.common.dataclass_floats import coerce_floats
from repro.common.seeding import eval_seed
from repro.sandbox.config import SandboxSpec
from repro.tasks.schema import Task

FINGERPRINT_CHARS = 12  # 48 bits: collisions are irrelevant at the scale of a results table
SPEC_VERSION = 2  # bump when the meaning of a field changes (old fingerprints then differ on purpose)
# 2: sample seeds are hashes of (seed, instance id, sample) (repro.common.seeding), no longer seed + sample


def canonical_json(value: Any) -> str:
    """Deterministic JSON: sorted keys, compact separators, UTF-8 kept, NaN/inf rejected."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def fingerprint_of(spec_dict: Mapping[str, Any]) -> str:
    """The fingerprint of a spec given as a dict (e.g. read back from a metrics.json)."""
    return hashlib.sha256(canonical_json(spec_dict).encode()).hexdigest()[:FINGERPRINT_CHARS]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_files(paths: Iterable[str | Path], root: str | Path | None = None) -> dict[str, str]:
    """``{path (relative to root when given): sha256}`` for config / prompt files."""
    out = {}
    for path in map(Path, paths):
        key = str(path.relative_to(root)) if root is not None else str(path)
        out[key] = sha256_bytes(path.read_bytes())
    return out


def tasks_sha256(tasks: Iterable[Task]) -> str:
    """sha256 of the task rows (sorted by instance id, canonical JSON), machine-independent: ``repo_path``
    (where the repository happens to live on this disk) is left out; ``base_commit`` pins its content."""
    rows = []
    for task in sorted(tasks, key=lambda t: t.instance_id):
        row = task.to_row()
        row.pop("repo_path", None)
        rows.append(row)
    return sha256_bytes(canonical_json(rows).encode())


@dataclass(frozen=True)
class HarnessSpec:
    """Which harness, at which version, with which config/prompt files (by sha256) and settings."""

    name: str
    version: str
    files_sha256: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)  # e.g. tool-call vs text mode, condenser settings

    @classmethod
    def from_identity(cls, identity: Mapping[str, Any]) -> HarnessSpec:
        """From ``Harness.identity()``: ``name``, ``version``, ``files_sha256``; everything else is settings."""
        rest = {k: v for k, v in identity.items() if k not in ("name", "version", "files_sha256")}
        return cls(str(identity["name"]), str(identity["version"]), dict(identity.get("files_sha256", {})), rest)


@dataclass(frozen=True)
class TaskSetSpec:
    """The task distribution: its name, the exact instances (a sorted set) and the sha256 of their rows."""

    name: str
    instance_ids: tuple[str, ...]
    data_sha256: str

    def __post_init__(self) -> None:
        ids = tuple(sorted(self.instance_ids))
        if len(set(ids)) != len(ids):
            raise ValueError(f"task set {self.name!r} lists an instance id more than once")
        object.__setattr__(self, "instance_ids", ids)

    @classmethod
    def from_tasks(cls, name: str, tasks: Iterable[Task]) -> TaskSetSpec:
        tasks = list(tasks)
        return cls(name, tuple(t.instance_id for t in tasks), tasks_sha256(tasks))


@dataclass(frozen=True)
class SamplingSpec:
    """Decoding parameters the proxy enforces for evaluation rollouts."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 1024
    seed: int | None = 0  # the base of every sample's seed (see EvalSpec.sample_seed)

    def __post_init__(self) -> None:
        coerce_floats(self, require_finite=True)


@dataclass(frozen=True)
class LimitsSpec:
    """Per-rollout limits given to the harness."""

    step_limit: int = 30
    time_limit_s: float = 600.0

    def __post_init__(self) -> None:
        coerce_floats(self, require_finite=True)


@dataclass(frozen=True)
class EvalSpec:
    """Everything an evaluation result depends on except the model; see the module docstring."""

    harness: HarnessSpec
    tasks: TaskSetSpec
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    limits: LimitsSpec = field(default_factory=LimitsSpec)
    sandbox: SandboxSpec = field(default_factory=SandboxSpec)
    k: int = 1  # samples per task
    seeds: dict[str, int] = field(default_factory=dict)  # other seeds that shape the run (task generation, ...)
    spec_version: int = SPEC_VERSION

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k (samples per task) must be >= 1, got {self.k}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples become lists); :meth:`from_dict` inverts it."""
        return json.loads(canonical_json(asdict(self)))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EvalSpec:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown eval spec fields {sorted(unknown)}; known: {sorted(known)}")
        parts = {"harness": HarnessSpec, "tasks": TaskSetSpec, "sampling": SamplingSpec, "limits": LimitsSpec,
                 "sandbox": SandboxSpec}
        values = {k: (parts[k](**v) if k in parts else v) for k, v in data.items()}
        return cls(**values)

    def fingerprint(self) -> str:
        """Short hex sha256 of the canonical JSON of :meth:`to_dict`."""
        return fingerprint_of(self.to_dict())

    def sample_seed(self, instance_id: str, sample: int) -> int | None:
        """The sampling seed of ``instance_id``'s ``sample``-th rollout (None: unseeded): a hash of the base seed,
        the instance and the sample, so no two rollouts of the evaluation share random numbers."""
        return None if self.sampling.seed is None else eval_seed(self.sampling.seed, instance_id, sample)

    def label(self) -> str:
        """``harness@version`` as tables print it."""
        return f"{self.harness.name}@{self.harness.version}"

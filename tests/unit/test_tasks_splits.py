"""Train / validation / test splits and the leakage check."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from repro.tasks.bundled import bundled_packages
from repro.tasks.distributions import LeakageError, TaskDistributionConfig, build_splits, check_leakage
from repro.tasks.families import assign_splits
from repro.tasks.mutate import function_names
from repro.tasks.schema import Task


def task(instance_id: str, key: str) -> Task:
    return Task(instance_id, "repro-bundled/x", "0" * 40, "text", extra={"function_key": key})


def test_assign_splits_is_fixed_and_proportional():
    keys = [f"package:p:p/core.py:f{i}" for i in range(20)]
    first = assign_splits(keys, [0.7, 0.1, 0.2])
    assert first == assign_splits(list(reversed(keys)), [0.7, 0.1, 0.2])
    assert Counter(first.values()) == {"train": 14, "validation": 2, "test": 4}
    assert set(assign_splits(keys[:3], [0.7, 0.1, 0.2]).values()) == {"train", "validation", "test"}


def test_every_bundled_package_has_functions_in_each_split():
    for name, package in bundled_packages().items():
        files = package.files()
        keys = [f"package:{name}:{m}:{f}" for m in package.modules() for f in function_names(files[m])]
        splits = Counter(assign_splits(keys, [0.7, 0.1, 0.2]).values())
        assert set(splits) == {"train", "validation", "test"}, (name, splits)


def test_leakage_check_passes_disjoint_splits():
    check_leakage({"train": [task("a", "k1"), task("b", "k2")], "test": [task("c", "k3")],
                   "validation": [task("d", "k4")]})
    check_leakage({"train": [task("a", "k1")], "test": [Task("swe", "o/r", "1" * 40, "text")]})  # no key: skipped


def test_leakage_check_fails_loudly_on_a_shared_function():
    pattern = r"(?s)split 'test' mutate a function also mutated in 'train'.*k2: b \(train\)"
    with pytest.raises(LeakageError, match=pattern):
        check_leakage({"train": [task("a", "k1"), task("b", "k2")], "test": [task("c", "k2")]})
    with pytest.raises(LeakageError, match="'validation'"):
        check_leakage({"train": [task("a", "k1")], "validation": [task("v", "k1")]})


def test_built_splits_are_disjoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path))
    cfg = TaskDistributionConfig(seed=1, families=["procedural"])
    splits = build_splits(cfg, {"train": 12, "validation": 3, "test": 6})
    assert {name: len(tasks) for name, tasks in splits.items()} == {"train": 12, "validation": 3, "test": 6}
    assert {t.extra["split"] for t in splits["test"]} == {"test"}
    assert {t.repo for t in splits["test"]} == {"repro-bundled/procedural-s1-test"}
    leaked = {**splits, "test": splits["test"] + splits["train"][:1]}
    with pytest.raises(LeakageError):
        check_leakage(leaked)

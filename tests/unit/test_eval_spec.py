"""The frozen eval spec: its fingerprint changes with every field and with nothing else."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.evaluation.spec import (
    EvalSpec,
    HarnessSpec,
    LimitsSpec,
    SamplingSpec,
    SandboxSpec,
    TaskSetSpec,
    fingerprint_of,
    sha256_files,
    tasks_sha256,
)
from repro.tasks.schema import Task

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
hexes = st.text("0123456789abcdef", min_size=8, max_size=8)
floats = st.floats(min_value=0, max_value=1e4, allow_nan=False, allow_infinity=False)

harnesses = st.builds(HarnessSpec, names, names, st.dictionaries(names, hexes, max_size=3),
                      st.dictionaries(names, st.integers(0, 9) | names, max_size=2))
task_sets = st.builds(lambda name, ids, sha: TaskSetSpec(name, tuple(ids), sha), names,
                      st.lists(names, min_size=1, max_size=5, unique=True), hexes)
specs = st.builds(
    EvalSpec, harnesses, task_sets,
    st.builds(SamplingSpec, floats, floats, st.integers(1, 10**5), st.none() | st.integers(0, 10**6)),
    st.builds(LimitsSpec, st.integers(1, 1000), floats),
    st.builds(SandboxSpec, names, floats, floats, st.integers(1, 10**5), st.integers(1, 10**5),
              st.dictionaries(names, names, max_size=2)),
    st.integers(1, 16), st.dictionaries(names, st.integers(0, 10**6), max_size=3),
)


def _leaves(value: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(value, dict):
        return [leaf for key, item in value.items() for leaf in _leaves(item, (*path, key))]
    if isinstance(value, list):
        return [(*path, i) for i in range(len(value))]
    return [path]


def _changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if value is None:
        return 7
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 0.5
    return value + "#changed-#!!"  # longer than any generated name: never collides with a sibling id


def _set(data: dict, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value


def _get(data: Any, path: tuple) -> Any:
    for key in path:
        data = data[key]
    return data


@settings(max_examples=60, deadline=None)
@given(specs, st.data())
def test_changing_any_single_field_changes_the_fingerprint(spec: EvalSpec, data: st.DataObject) -> None:
    base = spec.to_dict()
    path = data.draw(st.sampled_from(_leaves(base)))
    mutated = json.loads(json.dumps(base))
    _set(mutated, path, _changed(_get(base, path)))
    other = EvalSpec.from_dict(mutated)
    assert other.to_dict() != base
    assert other.fingerprint() != spec.fingerprint()


@settings(max_examples=40, deadline=None)
@given(specs, st.data())
def test_adding_or_removing_a_map_entry_changes_the_fingerprint(spec: EvalSpec, data: st.DataObject) -> None:
    base = spec.to_dict()
    where = data.draw(st.sampled_from([("harness", "files_sha256"), ("harness", "settings"), ("seeds",),
                                       ("sandbox", "settings")]))
    mutated = json.loads(json.dumps(base))
    target = _get(mutated, where)
    if target:
        target.pop(next(iter(target)))
    else:
        target["new"] = 1
    assert EvalSpec.from_dict(mutated).fingerprint() != spec.fingerprint()


@settings(max_examples=60, deadline=None)
@given(specs)
def test_equal_specs_give_equal_fingerprints_and_survive_json(spec: EvalSpec) -> None:
    again = EvalSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec
    assert again.fingerprint() == spec.fingerprint() == fingerprint_of(spec.to_dict())


def _reverse_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reverse_keys(value[k]) for k in reversed(list(value))}
    return value


@settings(max_examples=60, deadline=None)
@given(specs, st.randoms(use_true_random=False))
def test_key_and_instance_order_do_not_matter(spec: EvalSpec, rnd) -> None:
    data = _reverse_keys(spec.to_dict())
    ids = list(data["tasks"]["instance_ids"])
    rnd.shuffle(ids)
    data["tasks"]["instance_ids"] = ids
    assert EvalSpec.from_dict(data).fingerprint() == spec.fingerprint()
    assert fingerprint_of(data) != spec.fingerprint() or ids == sorted(ids)  # raw dict: order of ids counts


def _spec(**changes: Any) -> EvalSpec:
    base = dict(harness=HarnessSpec("mini-swe-agent", "2.4.6", {"a.yaml": "00"}),
                tasks=TaskSetSpec("t", ("b", "a"), "ff"))
    return EvalSpec(**{**base, **changes})


def test_fingerprint_is_a_short_stable_hex() -> None:
    fp = _spec().fingerprint()
    assert len(fp) == 12 and int(fp, 16) >= 0
    assert fp == _spec().fingerprint()
    assert _spec().tasks.instance_ids == ("a", "b")


def test_integer_and_float_spellings_fingerprint_alike() -> None:
    assert _spec(sampling=SamplingSpec(temperature=1, top_p=1)).fingerprint() == \
        _spec(sampling=SamplingSpec(temperature=1.0, top_p=1.0)).fingerprint()
    assert isinstance(SamplingSpec(temperature=1).temperature, float)


def test_bad_specs_are_refused() -> None:
    with pytest.raises(ValueError, match="more than once"):
        TaskSetSpec("t", ("a", "a"), "ff")
    with pytest.raises(ValueError, match="k"):
        _spec(k=0)
    with pytest.raises(ValueError, match="finite"):
        SamplingSpec(temperature=float("nan"))
    with pytest.raises(ValueError, match="unknown eval spec fields"):
        EvalSpec.from_dict({**_spec().to_dict(), "model": "x"})


def test_sample_seeds_follow_the_base_seed_instance_and_sample() -> None:
    spec = _spec(sampling=SamplingSpec(seed=10))
    seeds = {(t, i): spec.sample_seed(t, i) for t in ("a", "b") for i in range(3)}
    assert len(set(seeds.values())) == 6
    assert seeds == {(t, i): _spec(sampling=SamplingSpec(seed=10)).sample_seed(t, i) for t in ("a", "b")
                     for i in range(3)}
    assert spec.sample_seed("a", 0) != _spec(sampling=SamplingSpec(seed=11)).sample_seed("a", 0)
    assert _spec(sampling=SamplingSpec(seed=None)).sample_seed("a", 2) is None


def test_harness_identity_maps_to_spec() -> None:
    spec = HarnessSpec.from_identity({"name": "h", "version": "1", "files_sha256": {"p": "1"}, "mode": "text"})
    assert spec == HarnessSpec("h", "1", {"p": "1"}, {"mode": "text"})


def test_file_and_task_hashes(tmp_path: Path) -> None:
    (tmp_path / "prompt.yaml").write_text("hello")
    files = sha256_files([tmp_path / "prompt.yaml"], root=tmp_path)
    assert list(files) == ["prompt.yaml"] and len(files["prompt.yaml"]) == 64
    a = Task("i1", "o/r", "abc", "bug", FAIL_TO_PASS=["t1"])
    moved = Task("i1", "o/r", "abc", "bug", FAIL_TO_PASS=["t1"], repo_path="/elsewhere")
    changed = Task("i1", "o/r", "abc", "bug", FAIL_TO_PASS=["t2"])
    b = Task("i2", "o/r", "abc", "bug")
    assert tasks_sha256([a, b]) == tasks_sha256([b, moved])  # order and checkout location do not matter
    assert tasks_sha256([a, b]) != tasks_sha256([changed, b])
    assert TaskSetSpec.from_tasks("set", [b, a]).instance_ids == ("i1", "i2")


def test_the_model_name_a_harness_is_given_is_in_its_spec() -> None:
    """OpenCode picks its system prompt by the model name: the served name fills the identity's placeholder (two
    names, two fingerprints); an identity without the placeholder is left as it was (published fingerprints hold)."""
    from repro.rl.evaluator import with_model_name

    identity = {"name": "opencode", "version": "1.18.33", "settings": {"model_name": "{served_model_name}"}}
    named = with_model_name(identity, "qwen3-tiny")
    assert named["settings"]["model_name"] == "qwen3-tiny" and identity["settings"]["model_name"] != "qwen3-tiny"
    assert HarnessSpec.from_identity(named) != HarnessSpec.from_identity(with_model_name(identity, "gpt-5"))
    plain = {"name": "mini-swe-agent", "version": "2.4.6", "files": {"a.yaml": "00"}}
    assert with_model_name(plain, "qwen3-tiny") is plain

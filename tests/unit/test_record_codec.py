"""The compact on-disk form of a record's per-instance tables: lossless (keys in order, values and their types),
and it shrinks a record with many such tables."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repro.report.record_codec import LISTS, MIN_ENTRIES, compact, expand

IDS = st.text(min_size=1, max_size=12)
NUMBERS = st.one_of(st.integers(-5, 5), st.floats(0, 1, allow_nan=False))
TABLES = st.dictionaries(IDS, NUMBERS, min_size=MIN_ENTRIES, max_size=MIN_ENTRIES + 10)
LEAVES = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=5), TABLES)
RECORDS = st.recursive(LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                       max_leaves=12)


@given(st.dictionaries(st.text(min_size=1, max_size=6).filter(lambda k: k != LISTS), RECORDS, max_size=4))
def test_expand_undoes_compact_through_json(record: dict) -> None:
    back = expand(json.loads(json.dumps(compact(record))))
    assert back == record
    assert json.dumps(back) == json.dumps(record)  # the same keys in the same order, ints still ints


def test_tables_sharing_their_ids_store_them_once() -> None:
    ids = [f"repro-bundled__procedural-s0-test-task-{i:04d}" for i in range(500)]
    per_instance = {arm: {h: {t: float(i % 3 == 0) for i, t in enumerate(ids)} for h in ("a", "b")}
                    for arm in ("x", "y", "z")}
    record = {"metrics": {"per_instance": per_instance, "hist": {"1": 3, "2": 5}}}
    small = compact(record)
    assert len(small[LISTS]) == 1 and small["metrics"]["hist"] == {"1": 3, "2": 5}  # small dicts stay
    assert len(json.dumps(small)) < len(json.dumps(record)) / 4
    assert expand(small) == record


def test_a_record_with_the_reserved_key_is_refused() -> None:
    with pytest.raises(ValueError, match=LISTS):
        compact({LISTS: []})

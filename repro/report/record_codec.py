"""The on-disk form of a run record's per-instance tables: a dict of many numbers keyed by instance id (a run's
``per_instance``, ``warm_per_instance``...) is written as its values and a reference to its key list, each distinct
key list once per record (``instance_ids``). Lossless (the same keys in the same order, the same values):
:func:`compact` when a record is written, :func:`expand` when it is read. A record of a 500-task harness matrix
shrinks from ~480 KB to ~80 KB, most of it the one list of instance ids."""

from __future__ import annotations

from typing import Any

MIN_ENTRIES = 20  # smaller numeric dicts (histograms, settings) stay as they are
IDS, VALUES, LISTS = "$ids", "$values", "instance_ids"


def _is_table(node: dict[str, Any]) -> bool:
    return len(node) >= MIN_ENTRIES and IDS not in node and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in node.values())


def compact(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with every per-instance table replaced by ``{"$ids": i, "$values": [...]}`` and the key lists
    under ``instance_ids`` (absent when there is none)."""
    if LISTS in record:
        raise ValueError(f"a record may not have a top-level {LISTS!r} key")
    lists: list[list[str]] = []
    index: dict[tuple[str, ...], int] = {}

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if _is_table(node):
                keys = tuple(node)
                if keys not in index:
                    index[keys] = len(lists)
                    lists.append(list(keys))
                return {IDS: index[keys], VALUES: list(node.values())}
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    out = walk(record)
    return out | {LISTS: lists} if lists else out


def expand(record: dict[str, Any]) -> dict[str, Any]:
    """The record :func:`compact` was given (a record without ``instance_ids`` is returned as it is)."""
    if LISTS not in record:
        return record
    lists = record[LISTS]

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if set(node) == {IDS, VALUES}:
                return dict(zip(lists[node[IDS]], node[VALUES], strict=True))
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk({k: v for k, v in record.items() if k != LISTS})

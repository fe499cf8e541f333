"""What a table's records say about how its split was used: which split, how many configurations scored it, when
and at which commit, and whether the validation runs of the same experiment came before the test runs.

A table states this from its records, not from intent: "every choice is made on the validation split" is a claim
only the records' timestamps can back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from repro.report.cells import hydra_experiment

Runs = list[dict[str, Any]]


def split_name(run: dict[str, Any]) -> str:
    """The split a run scored: the task set's ``split`` setting, else the third field of a bundled task set's
    name (``bundled:procedural:test:...``), else ``?``."""
    tasks = ((run.get("run_config") or {}).get("tasks") or {})
    if tasks.get("split"):
        return str(tasks["split"])
    parts = str(run.get("task_distribution", "")).split(":")
    return parts[2] if len(parts) > 2 and parts[0] == "bundled" else "?"


def split_stream(run: dict[str, Any]) -> str | None:
    """The task modules a run scored, whatever their number or statement style: ``procedural:test:s0`` of
    ``bundled:procedural:test:locate:n150:s0`` (a smaller set is a prefix of a larger one, and every difficulty is
    written on the same modules); None for runs that scored no bundled task set."""
    parts = str(run.get("task_distribution", "")).split(":")
    if len(parts) < 4 or parts[0] != "bundled":
        return None
    return ":".join([parts[1], parts[2], parts[-1]])


def without_seeds(node: Any) -> Any:
    """A config tree without its ``seed`` keys (the training seed reaches the model, SFT, RL, filter...)."""
    if isinstance(node, dict):
        return {k: without_seeds(v) for k, v in node.items() if k != "seed"}
    return [without_seeds(v) for v in node] if isinstance(node, list) else node


def configuration(run: dict[str, Any]) -> str:
    """What makes runs of any table one configuration: the experiment and its whole config less the training seeds
    (the kind and fingerprint where a record has no config)."""
    config = run.get("run_config")
    if not config:
        return f"{hydra_experiment(run)}\0{run.get('kind')}:{run.get('fingerprint')}"
    body = json.dumps(without_seeds(config), sort_keys=True)
    return f"{hydra_experiment(run)}\0{body}"


def count_split_use(runs: Runs) -> None:
    """Give every run scoring a bundled task stream ``split_configurations``: how many distinct configurations
    among ``runs`` (every published record, all tables) scored that stream, and ``split_first_scored``: when the
    first of them started."""
    by_stream: dict[str, set[str]] = {}
    first: dict[str, float] = {}
    for run in runs:
        stream = split_stream(run)
        if stream is not None:
            by_stream.setdefault(stream, set()).add(configuration(run))
            first[stream] = min(first.get(stream, float("inf")), run.get("started_at", 0))
    for run in runs:
        stream = split_stream(run)
        if stream is not None:
            run["split_configurations"] = len(by_stream[stream])
            run["split_first_scored"] = first[stream]


def _use(runs: Runs) -> str:
    """The sentence on how many configurations of every published table scored these runs' modules, and when the
    first did ("" where :func:`count_split_use` has not counted them)."""
    counted = [r for r in runs if "split_configurations" in r]
    if not counted:
        return ""
    count, stream = counted[0]["split_configurations"], split_stream(counted[0])
    return (f" Over every published table, {count} distinct configuration{'s' if count > 1 else ''} "
            f"{'have' if count > 1 else 'has'} scored these modules (`{stream}`, any size or statement style), "
            f"the first on {_when(counted[0]['split_first_scored'])} UTC.")


def _when(started: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(started))


def _span(runs: Runs) -> str:
    times = sorted(r.get("started_at", 0) for r in runs)
    return _when(times[0]) if len(times) == 1 else f"{_when(times[0])} to {_when(times[-1])}"


def _commits(runs: Runs) -> str:
    shas = sorted({r["git_sha"][:7] for r in runs if r.get("git_sha")})
    known = ", ".join(f"`{s}`" for s in shas) or "(not recorded)"
    return known + (" (some not recorded)" if shas and any(not r.get("git_sha") for r in runs) else "")


def _job(run: dict[str, Any]) -> str:
    """What makes runs one experiment whatever their table: the job function the config ran (its name, so that a
    module moved between records is the same job), else the experiment name."""
    target = ((run.get("run_config") or {}).get("job") or {}).get("_target_")
    return str(target).rsplit(".", 1)[-1] if target else hydra_experiment(run)


def protocol_note(runs: Runs, kind_runs: Runs, config_key: Callable[[dict[str, Any]], tuple]) -> str:
    """A paragraph per task stream the table's runs scored (:func:`split_stream`; a table whose default moved to a
    fresh test split has one for each): see :func:`stream_note`."""
    streams: dict[str | None, Runs] = {}
    for run in runs:
        streams.setdefault(split_stream(run), []).append(run)
    return "\n\n".join(stream_note(group, kind_runs, config_key) for group in streams.values())


def stream_note(runs: Runs, kind_runs: Runs, config_key: Callable[[dict[str, Any]], tuple]) -> str:
    """One paragraph: the split these runs scored, by how many configurations, when, at which commits; for a test
    split, the published validation runs of the same job and whether they started before the first test run
    (``kind_runs``: every run of the table's kind, other tables included)."""
    first, split = runs[0], split_name(runs[0])
    configs = len({config_key(r) for r in runs})
    text = (f"Protocol, from the records: {len(runs)} run{'s' if len(runs) > 1 else ''} of "
            f"{configs} configuration{'s' if configs > 1 else ''} scored the {split} split "
            f"`{first.get('task_distribution', '?')}`, started {_span(runs)} UTC at commit {_commits(runs)}."
            + _use(runs))
    if split != "test":
        return text
    experiment = hydra_experiment(first)
    validation = [r for r in kind_runs if split_name(r) == "validation" and _job(r) == _job(first)]
    if not validation:
        return text + (f" No validation run of `{experiment}` is published, so no choice behind this table is "
                       "backed by a validation record.")
    start = min(r.get("started_at", 0) for r in runs)
    late = [r for r in validation if r.get("started_at", 0) >= start]
    verdict = (f"{len(late)} of them started after the first test run here, so they cannot have chosen what this "
               "table scored" if late else "all of them started before the first test run here")
    history = (" Splits scored by earlier configurations whose records are not published: `docs/miniature.md`, "
               "\"Protocol\".") if late else ""
    return text + (f" Published validation runs of `{experiment}`: {len(validation)} "
                   f"({', '.join(_when(r.get('started_at', 0)) for r in validation)} UTC); {verdict}.{history}")

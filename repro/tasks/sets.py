"""A task set as a job names it: a bundled distribution (:class:`~repro.tasks.distributions.TaskDistributionConfig`)
or a file / dataset on disk (:class:`TaskFileConfig`), loaded with the name the tables call it by."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.tasks.loaders import load_tasks
from repro.tasks.schema import Task


@dataclass
class TaskFileConfig:
    """Tasks from a file or dataset (JSON / JSONL / HF datasets on disk) instead of a bundled distribution."""

    source: str
    split: str | None = None
    instance_ids: list[str] | None = None
    name: str = ""


def load_task_set(tasks: TaskDistributionConfig | TaskFileConfig) -> tuple[str, list[Task]]:
    """The task set and its name (what the table calls the task distribution)."""
    if isinstance(tasks, TaskFileConfig):
        return tasks.name or Path(tasks.source).stem, load_tasks(tasks.source, tasks.split, tasks.instance_ids)
    families = "+".join(tasks.families)
    return f"bundled:{families}:{tasks.split}:{tasks.difficulty}:n{tasks.n_tasks}:s{tasks.seed}", \
        build_distribution(tasks)

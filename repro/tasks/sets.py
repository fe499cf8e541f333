"""A task set as a job names it: a bundled distribution (:class:`~repro.tasks.distributions.TaskDistributionConfig`)
or a file / dataset on disk (:class:`TaskFileConfig`), loaded with the name the tables call it by."""

from __future__ import annotations

import random
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
    n_tasks: int = 0  # > 0: a seeded draw of this many (kept in file order); 0: all
    seed: int = 0  # the draw's seed

    def __post_init__(self) -> None:
        if self.n_tasks < 0:
            raise ValueError(f"tasks.n_tasks must be >= 0 (0: every task of the file), got {self.n_tasks}")

    def pick(self, tasks: list[Task]) -> list[Task]:
        """``n_tasks`` of ``tasks`` drawn with ``seed``, in their file order (all when ``n_tasks`` is 0 or more than
        the file holds)."""
        if not 0 < self.n_tasks < len(tasks):
            return tasks
        keep = set(random.Random(self.seed).sample(range(len(tasks)), self.n_tasks))
        return [t for i, t in enumerate(tasks) if i in keep]


def load_task_set(tasks: TaskDistributionConfig | TaskFileConfig) -> tuple[str, list[Task]]:
    """The task set and its name (what the table calls the task distribution)."""
    if isinstance(tasks, TaskFileConfig):
        name = tasks.name or Path(tasks.source).stem
        if tasks.n_tasks:
            name = f"{name}:n{tasks.n_tasks}:s{tasks.seed}"
        return name, tasks.pick(load_tasks(tasks.source, tasks.split, tasks.instance_ids))
    families = "+".join(tasks.families)
    return f"bundled:{families}:{tasks.split}:{tasks.difficulty}:n{tasks.n_tasks}:s{tasks.seed}", \
        build_distribution(tasks)

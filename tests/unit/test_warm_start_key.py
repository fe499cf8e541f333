"""The warm-start cache key names every input of the checkpoint, including the prompt's platform line."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import pytest

from repro.jobs.warm_start import WarmStartConfig, prompt_platform, warm_start_key
from repro.tasks.schema import Task


@pytest.fixture
def base_model(tmp_path: Path) -> Path:
    (tmp_path / "repro_model.json").write_text(json.dumps({"seed": 0}))
    return tmp_path


def _task(i: int) -> Task:
    return Task(instance_id=f"t{i}", repo="r", base_commit="c" * 40, patch=f"p{i}", problem_statement="s")


def test_the_key_changes_with_the_platform_line_and_the_tasks(base_model: Path, monkeypatch) -> None:
    tasks = [_task(0), _task(1)]
    key = warm_start_key(base_model, tasks, {"name": "h"}, WarmStartConfig())
    assert key == warm_start_key(base_model, tasks, {"name": "h"}, WarmStartConfig())
    assert key != warm_start_key(base_model, tasks[:1], {"name": "h"}, WarmStartConfig())
    real = platform.uname()
    monkeypatch.setattr(platform, "uname", lambda: real._replace(release="0.0.0-other"))
    assert "0.0.0-other" in prompt_platform()
    assert key != warm_start_key(base_model, tasks, {"name": "h"}, WarmStartConfig())

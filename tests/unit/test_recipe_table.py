"""docs/recipe.md is the composed recipe beside Agent Lightning's values: regenerated here and compared, so the config
and the table cannot drift; an unexplained difference or a stale reason fails the rendering."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from omegaconf import open_dict

from repro.report import recipe_table
from repro.report.recipe_table import FILES, SETTINGS, composed_recipe, render

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cfg():
    return composed_recipe()


def test_the_committed_table_is_the_composed_recipe(cfg) -> None:
    committed = (ROOT / recipe_table.OUT).read_text()
    assert committed == render(cfg), "docs/recipe.md is stale: run `python -m repro.report.recipe_table`"


def test_every_keyed_setting_exists_and_every_source_names_a_file_and_lines(cfg) -> None:
    for setting in SETTINGS:
        for part in setting.source.split(", "):
            name, lines = part.split(":")
            assert name in FILES and re.fullmatch(r"\d+(-\d+)?", lines), (setting.name, part)
        assert (setting.key is None) == bool(setting.ours), setting.name


def test_a_changed_value_without_a_reason_fails(cfg) -> None:
    changed = cfg.copy()
    with open_dict(changed):
        changed.trainer.clip_ratio_c = 0.0
    with pytest.raises(ValueError, match=r"trainer\.clip_ratio_c = 0\.0 differs"):
        render(changed)


def test_a_stale_reason_fails(cfg, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tuple(dataclasses.replace(s, why="it differs") if s.key == "rl.tasks_per_step" else s for s in SETTINGS)
    monkeypatch.setattr(recipe_table, "SETTINGS", stale)
    with pytest.raises(ValueError, match="drop the reason"):
        render(cfg)


def test_the_table_counts_the_differences(cfg) -> None:
    text = render(cfg)
    differ = sum(1 for s in SETTINGS if s.why)
    assert f"{len(SETTINGS)} settings, {differ} differ" in text
    assert text.count("\n| ") == len(SETTINGS) + 1  # the header and one line per setting

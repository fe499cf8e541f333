"""The warm-start cache key names every input of the checkpoint, including the prompt's platform line."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import pytest

from repro.recipe.warm_start import WarmStartConfig, prompt_platform, warm_start_key
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


def test_a_pinned_platform_gives_the_same_key_and_environment_on_any_kernel(base_model: Path, monkeypatch) -> None:
    """harness.platform (the default) pins the prompt's line: another kernel string changes neither the key nor
    the template variables the harness process gets; ``platform: {}`` follows the host."""
    from harness_adapters.mini_swe_agent.adapter import MiniSweAgentConfig, build_process_env, platform_variables

    pinned, host = MiniSweAgentConfig(), MiniSweAgentConfig(platform={})
    tasks, cfg = [_task(0)], WarmStartConfig()

    def key_and_env(harness: MiniSweAgentConfig) -> tuple[str, dict[str, str]]:
        env = build_process_env(harness, home=base_model, config_dir=base_model)
        return warm_start_key(base_model, tasks, {}, cfg, prompt_platform(harness)), env

    before, before_host = key_and_env(pinned), key_and_env(host)
    real = platform.uname()
    monkeypatch.setattr(platform, "uname", lambda: real._replace(release="0.0.0-other", version="#9 other"))
    assert key_and_env(pinned) == before
    assert before[1]["release"] == "6.1.0" and "release" not in before_host[1]
    assert key_and_env(host)[0] != before_host[0]
    assert platform_variables(host.platform)["release"] == "0.0.0-other"
    assert platform_variables(pinned.platform)["release"] == "6.1.0"
    with pytest.raises(ValueError, match=r"platform\.uname"):
        MiniSweAgentConfig(platform={"kernel": "x"})


def test_max_length_enters_the_key_only_when_set(base_model: Path) -> None:
    """Whole rows (``max_length=0``) keep the keys of warm starts made before the option existed."""
    from dataclasses import replace

    from repro.recipe.warm_start import sft_identity

    cfg = WarmStartConfig()
    assert "max_length" not in sft_identity(cfg.sft)
    cut = replace(cfg, sft=replace(cfg.sft, max_length=512))
    assert sft_identity(cut.sft)["max_length"] == 512
    assert warm_start_key(base_model, [_task(0)], {}, cut) != warm_start_key(base_model, [_task(0)], {}, cfg)


def test_held_out_rows_and_their_gate_enter_the_key_only_when_set(base_model: Path) -> None:
    """No rows held out keeps earlier warm starts' keys; holding rows out, or gating on them, is another warm start."""
    from dataclasses import replace

    from repro.recipe.warm_start import sft_identity

    cfg = WarmStartConfig()
    plain = sft_identity(cfg.sft)
    assert not {"holdout_every", "holdout_steps", "decay_at_reproduced"} & set(plain)
    held = replace(cfg, sft=replace(cfg.sft, holdout_every=25))
    gated = replace(held, sft=replace(held.sft, decay_at_reproduced=0.2))
    assert sft_identity(held.sft)["holdout_every"] == 25 and "max_steps_factor" not in sft_identity(held.sft)
    assert sft_identity(gated.sft)["decay_at_reproduced"] == 0.2 and "max_steps_factor" in sft_identity(gated.sft)
    keys = {warm_start_key(base_model, [_task(0)], {}, c) for c in (cfg, held, gated)}
    assert len(keys) == 3


def test_a_whole_number_typed_for_a_float_setting_keeps_the_key(base_model: Path) -> None:
    """``warm_start.sft.decay_at_loss=0`` on the command line (an int) is the default 0.0: the same warm start (a run
    with that override once trained its warm start again under another key)."""
    from dataclasses import replace

    from repro.train.config import SftConfig

    gated = SftConfig(holdout_every=25, decay_at_reproduced=0.2)
    typed = SftConfig(holdout_every=25, decay_at_reproduced=0.2, decay_at_loss=0, learning_rate=3, epochs=8)
    assert isinstance(typed.decay_at_loss, float) and isinstance(typed.learning_rate, float)
    assert isinstance(typed.holdout_every, int) and typed.bf16 is False
    cfg = WarmStartConfig(sft=gated)
    same = WarmStartConfig(sft=replace(typed, learning_rate=gated.learning_rate, epochs=gated.epochs))
    assert warm_start_key(base_model, [_task(0)], {}, same) == warm_start_key(base_model, [_task(0)], {}, cfg)


def test_a_demonstration_max_tokens_cap_enters_the_key_only_when_set(base_model: Path) -> None:
    from dataclasses import replace

    cfg = WarmStartConfig()
    key = warm_start_key(base_model, [_task(0)], {}, cfg)
    assert key == warm_start_key(base_model, [_task(0)], {}, replace(cfg, max_tokens=0))
    assert key != warm_start_key(base_model, [_task(0)], {}, replace(cfg, max_tokens=256))


def test_the_demonstrations_key_ignores_the_weights_and_names_the_tokenizer(base_model: Path) -> None:
    """A training seed changes the base model's weights and ``repro_model.json``, not the demonstrations: a sweep
    over seeds records them once; another tokenizer, task set or platform line gives other rows."""
    from repro.recipe.warm_start import demos_key

    (base_model / "tokenizer.json").write_text('{"v": 1}')
    tasks, cfg, line = [_task(0), _task(1)], WarmStartConfig(), prompt_platform()
    key = demos_key(base_model, tasks, {"name": "h"}, cfg, line)
    (base_model / "repro_model.json").write_text(json.dumps({"seed": 1}))
    (base_model / "model.safetensors").write_bytes(b"other weights")
    assert demos_key(base_model, tasks, {"name": "h"}, cfg, line) == key
    assert demos_key(base_model, tasks[:1], {"name": "h"}, cfg, line) != key
    assert demos_key(base_model, tasks, {"name": "h"}, cfg, line + " other") != key
    (base_model / "tokenizer.json").write_text('{"v": 2}')
    assert demos_key(base_model, tasks, {"name": "h"}, cfg, line) != key


def test_cached_demonstrations_are_the_recorded_rows(tmp_path: Path, monkeypatch) -> None:
    """The second call reads the rows the first recorded, token for token, without recording again."""
    import repro.recipe.warm_start as ws

    recorded = [ws.DemoRow([5, 6, 7], [0, 1, 1]), ws.DemoRow([5, 8], [0, 1])]
    calls: list[int] = []
    monkeypatch.setattr(ws, "cache_dir", lambda: tmp_path / "cache")
    monkeypatch.setattr(ws, "record_demonstrations", lambda *a: calls.append(1) or ["r1", "r2"])
    monkeypatch.setattr(ws, "demonstration_rows", lambda *a: recorded)
    args = (ws.WarmStartRun(None, None, None, tmp_path / "run"), tmp_path, [], WarmStartConfig(), "k1")
    assert ws.demonstrations(*args) == (recorded, 2, False)
    rows, n, cached = ws.demonstrations(*args)
    assert (rows, n, cached) == (recorded, 2, True) and calls == [1]
    uncached = WarmStartConfig(use_cache=False)
    assert ws.demonstrations(*args[:3], uncached, *args[4:])[2] is False and calls == [1, 1]

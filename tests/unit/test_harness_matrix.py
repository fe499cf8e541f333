"""The harness matrix's pieces: which arms it trains, the tokenizer's texts from every harness, how demonstration
tasks are dealt out, and the mixed warm start's cache key."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from repro.recipe.matrix import REBUILT, HarnessSet, MatrixConfig
from repro.recipe.warm_start import WarmStartConfig
from repro.recipe.warm_start_mix import mix_key, mixed_sft, shares
from repro.tasks.schema import Task


def test_the_arms_are_one_per_proxy_harness_and_the_rebuilt_loop() -> None:
    cfg = MatrixConfig({"a": object(), "b": object()}, train_in=["a", "b"], rebuilt_of="a")
    assert cfg.arms == [("a", "a", "proxy"), ("b", "b", "proxy"), (REBUILT, "a", REBUILT)]
    assert MatrixConfig({"a": object()}).arms == []  # the warm start alone, evaluated in every harness


@pytest.mark.parametrize("bad", [{"train_in": ["c"]}, {"rebuilt_of": "c"}])
def test_an_arm_must_name_a_harness_of_the_matrix(bad: dict) -> None:
    with pytest.raises(ValueError, match=r"not among matrix\.harnesses"):
        MatrixConfig({"a": object()}, **bad)
    with pytest.raises(ValueError, match="rebuilt-loop arm"):
        MatrixConfig({REBUILT: object()})


class Cfg:
    def __init__(self, texts: list[str], tools: list[dict]) -> None:
        self.texts, self.tool_list = texts, tools

    def fixed_prompt_texts(self, platform_line: bool = False) -> list[str]:
        return [*self.texts, *(["<platform>"] if platform_line else [])]

    def tools(self) -> list[dict]:
        return self.tool_list


def test_the_tokenizer_gets_every_harness_texts_once() -> None:
    bash = {"type": "function", "function": {"name": "bash"}}
    both = HarnessSet([Cfg(["system", "observe"], [bash]), Cfg(["observe", "format error"], [])])
    assert both.fixed_prompt_texts() == ["format error", "observe", "system"]
    assert both.fixed_prompt_texts(platform_line=True) == ["<platform>", "format error", "observe", "system"]
    assert both.tools() == [bash]


def test_a_captured_harness_brings_its_own_tools_block_and_calls(monkeypatch) -> None:
    """A harness whose prompts are built inside it adds its captured texts with its own tools block and call
    wrappers as texts (its tools are not merged into the mini-SWE-agent tools block, which stays as it was)."""
    import repro.recipe.matrix as matrix
    from repro.recipe.harness_texts import CapturedTexts
    from repro.tinymodel.vocab import tool_call_pieces, tools_block_texts

    terminal = {"type": "function", "function": {"name": "terminal", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}}}}
    bash = {"type": "function", "function": {"name": "bash"}}
    captured = CapturedTexts(("You are OpenHands agent.",), (terminal,))
    monkeypatch.setattr(matrix, "harness_texts", lambda name, cfg, identity: captured)
    monkeypatch.setattr(matrix, "name_for_config", lambda cfg: "openhands")

    class Agent:
        def identity(self) -> dict:
            return {"name": "openhands"}

    mini = Cfg(["system"], [bash])
    both = matrix.recipe_harness_set({"mswea2": Agent(), "openhands": Agent()}, {"mswea2": mini, "openhands": object()})
    texts = both.fixed_prompt_texts()
    assert "system" in texts and "You are OpenHands agent." in texts
    assert set(tools_block_texts([terminal])) <= set(texts) and set(tool_call_pieces("terminal")) <= set(texts)
    assert both.tools() == [bash] and both.configs == [mini]
    alone = matrix.recipe_harness_set({"mswea2": Agent()}, {"mswea2": mini})
    assert alone.fixed_prompt_texts() == ["system"]  # a mini-only matrix keeps its tokenizer's texts


def _tasks(n: int) -> list[Task]:
    return [Task(instance_id=f"t{i}", repo="o/r", base_commit="c", problem_statement="p", patch=f"p{i}")
            for i in range(n)]


def test_demonstration_tasks_are_dealt_in_turn_and_none_is_lost() -> None:
    dealt = shares(_tasks(7), 2)
    assert [[t.instance_id for t in share] for share in dealt] == [["t0", "t2", "t4", "t6"], ["t1", "t3", "t5"]]


def test_the_mixed_key_changes_with_any_source_and_with_sft(tmp_path: Path) -> None:
    (tmp_path / "repro_model.json").write_text("{}")
    tasks = _tasks(4)
    sources = [({"name": "h", "version": "2"}, "Linux", tasks[:2]), ({"name": "h", "version": "1"}, "Linux", tasks[2:])]
    key = mix_key(tmp_path, sources, WarmStartConfig())
    assert key == mix_key(tmp_path, sources, WarmStartConfig()) and key.startswith("mix-")
    swapped = [(sources[0][0], "Linux", tasks[2:]), (sources[1][0], "Linux", tasks[:2])]
    assert mix_key(tmp_path, swapped, WarmStartConfig()) != key  # which harness ran which tasks matters
    other = WarmStartConfig()
    other.sft.learning_rate = 1e-3
    assert mix_key(tmp_path, sources, other) != key
    staged = WarmStartConfig(mix_init="first_harness", mix_sft={"epochs": 2.0})
    assert mix_key(tmp_path, sources, staged, "warm-a") != mix_key(tmp_path, sources, staged, "warm-b")
    assert mix_key(tmp_path, sources, WarmStartConfig(mix_init="first_harness"), "warm-a") != \
        mix_key(tmp_path, sources, staged, "warm-a")  # the mixed run's own SFT settings are in its key


def test_the_mixed_sft_changes_only_what_mix_sft_names_and_needs_a_first_harness_start() -> None:
    cfg = WarmStartConfig(mix_init="first_harness", mix_sft={"epochs": 2.0, "decay_at_reproduced": 0.0})
    cfg.sft.decay_at_reproduced, cfg.sft.learning_rate = 0.1, 1e-3
    mixed = mixed_sft(cfg).sft
    assert (mixed.epochs, mixed.decay_at_reproduced, mixed.learning_rate) == (2.0, 0.0, 1e-3)
    assert cfg.sft.epochs != 2.0  # the first harness's own warm start keeps its settings
    with pytest.raises(ValueError, match="mix_init=first_harness"):
        mixed_sft(WarmStartConfig(mix_sft={"epochs": 2.0}))
    with pytest.raises(ValueError, match="does not have"):
        mixed_sft(WarmStartConfig(mix_init="first_harness", mix_sft={"epoch": 2.0}))
    with pytest.raises(ValueError, match="mix_init must be one of"):
        mixed_sft(WarmStartConfig(mix_init="first"))


def _evaluation(values: dict[str, float]) -> dict:
    share = sum(values.values()) / len(values)
    return {"pass_at_1": share, "n_samples": len(values), "ci": {"low": share, "high": share}}


def _run(seed: int, home: float, away: float) -> dict:
    """A 10-instance run: the warm start solves instances 0-1 everywhere; the arm trained in h1 solves ``home`` of
    them in h1 and ``away`` in h2; the arm trained in h2 the reverse."""
    def solved(share: float) -> dict[str, float]:
        return {f"i{i}": float(i < 10 * share) for i in range(10)}

    warm = {h: solved(0.2) for h in ("h1", "h2")}
    arms = {"h1": {"h1": solved(home), "h2": solved(away)}, "h2": {"h1": solved(away), "h2": solved(home)}}
    return {"run_dir": f"outputs/harness_matrix/2026120{seed}", "seed": seed, "fingerprints": {"h1": "f1", "h2": "f2"},
            "harnesses": {"h1": "mini-swe-agent@2.4.6", "h2": "mini-swe-agent@1.17.5"}, "train_tasks": "t",
            "task_distribution": "d", "rl": {"steps": 1, "tasks_per_step": 1, "samples_per_task": 1, "seed": seed},
            "trainer": {}, "warm_start": {"key": "k"}, "warm": {h: _evaluation(v) for h, v in warm.items()},
            "warm_per_instance": warm,
            "fidelity": {"h1": {"rollouts": 4, "turns": 10, "divergent_turns": 1},
                         "h2": {"rollouts": 4, "turns": 10, "divergent_turns": 5 + seed}},
            "arms": {a: {"trained_in": a, "loop": "proxy", "per_instance": pi,
                         "diagnostics": [{"calls_per_rollout": 2.0 + seed}, {"calls_per_rollout": 3.0}],
                         "after": {h: _evaluation(v) for h, v in pi.items()},
                         "paired_vs_warm": {h: {"delta": sum(v.values()) / 10 - 0.2} for h, v in pi.items()}}
                     for a, pi in arms.items()}}


def test_the_table_pools_seeds_and_shows_what_training_at_home_gains() -> None:
    from repro.report.harness_matrix_table import home_rows, matrix_markdown, matrix_rows

    group = [_run(0, 0.6, 0.4), _run(1, 0.8, 0.4)]  # at home 60% and 80%: pooled 70%; away 40%
    rows = {r["trained in"]: r for r in matrix_rows(group)}
    assert rows["h1 (mini-swe-agent@2.4.6)"]["in mini-swe-agent@2.4.6"].startswith("70.0%")
    assert rows["h1 (mini-swe-agent@2.4.6)"]["gain in mini-swe-agent@2.4.6"].startswith("+50.0")
    assert rows["warm start"]["in mini-swe-agent@1.17.5"].startswith("20.0%")
    home = {(r["evaluated in"], r["minus trained in"]): r for r in home_rows(group)}
    assert home[("mini-swe-agent@2.4.6", "h2 (mini-swe-agent@1.17.5)")]["difference [95% CI]"].startswith("+30.0")
    assert home[("mini-swe-agent@2.4.6", "h2 (mini-swe-agent@1.17.5)")]["seed sd"] == "14.1"  # seeds +20, +40
    assert home[("mini-swe-agent@2.4.6", "h2 (mini-swe-agent@1.17.5)")]["each seed"] == "+20.0, +40.0"
    assert "Trained here minus trained elsewhere" in matrix_markdown(group)


def test_the_loop_table_pools_calls_and_replayed_turns_over_seeds() -> None:
    from repro.report.harness_matrix_table import loop_rows

    group = [_run(0, 0.6, 0.4), _run(1, 0.8, 0.4)]
    for run in group:  # a rebuilt arm makes the fidelity column
        run["arms"]["rebuilt"] = run["arms"]["h1"] | {"loop": "rebuilt"}
    rows = {r["training loop"]: r for r in loop_rows(group)}
    column = "its rollouts replayed through rebuilt: divergent turns"
    assert rows["h1 (mini-swe-agent@2.4.6)"]["calls per RL rollout"] == "2.75"  # (2 + 3 + 3 + 3) / 4
    assert rows["h1 (mini-swe-agent@2.4.6)"][column] == "2/20 (10.0%), 8 rollouts"
    assert rows["h2 (mini-swe-agent@1.17.5)"][column] == "11/20 (55.0%), 8 rollouts"
    assert column not in rows["rebuilt (the rebuilt loop of mini-swe-agent@2.4.6)"]


def test_the_tables_come_with_a_heatmap_of_the_csv(tmp_path: Path) -> None:
    from repro.report.harness_matrix_table import write_harness_matrix_tables

    overrides = ["experiment=harness_matrix", "run.dir=/x/y", "seed=0", "tasks.n_tasks=9"]
    runs = [_run(0, 0.6, 0.4) | {"table": "harness_matrix", "experiment": "harness_matrix", "overrides": overrides},
            _run(1, 0.8, 0.4) | {"table": "harness_matrix", "experiment": "harness_matrix"}]
    written = write_harness_matrix_tables(runs, tmp_path)
    assert sorted(p.name for p in written) == ["harness_matrix.csv", "harness_matrix.md", "harness_matrix.svg",
                                                 "harness_matrix_families.csv"]
    markdown = (tmp_path / "harness_matrix.md").read_text()
    assert markdown.rstrip().endswith("(harness_matrix.svg)")
    assert "`repro run -m experiment=harness_matrix tasks.n_tasks=9 seed=0,1`" in markdown  # no machine paths
    assert "<svg" in (tmp_path / "harness_matrix.svg").read_text()


def test_the_loop_slice_of_a_run_is_named_by_its_run() -> None:
    from repro.report.cells import run_name

    assert run_name("outputs/harness_matrix/20261205-183250/0/loop_comparison") == "20261205-183250/0"
    assert run_name("outputs/harness_matrix/20261205-183250-0-loop_comparison") == "20261205-183250-0-loop_comparison"
    assert run_name("outputs/loop_comparison/20261205-183250") == "20261205-183250"


def test_the_command_line_joins_the_seeds_and_drops_machine_paths() -> None:
    from repro.report.cells import command_line

    runs = [{"seed": s, "experiment": "loop_comparison", "overrides": [
        "experiment=harness_matrix", "run.output_root=/data/out", f"seed={s}", "tasks.n_tasks=9"]} for s in (0, 1, 2)]
    assert command_line(runs) == "repro run -m experiment=harness_matrix tasks.n_tasks=9 seed=0,1,2"
    assert command_line([{"seed": 3, "experiment": "mini_repro"}]) == "repro run -m experiment=mini_repro seed=3"


@pytest.mark.parametrize(("split", "table"),
                         [("test", "loop_comparison"), ("validation", "loop_comparison_validation")])
def test_the_loop_slice_of_a_validation_run_has_its_own_table(monkeypatch, split: str, table: str) -> None:
    """A validation run's proxy-vs-rebuilt slice never joins the test split's loop_comparison table."""
    from types import SimpleNamespace

    import repro.experiments.harness_matrix as matrix

    monkeypatch.setattr(matrix, "comparison_metrics", lambda *args: {"kind": "loop_comparison"})
    mini = SimpleNamespace(cfg=SimpleNamespace(tasks=SimpleNamespace(split=split)),
                           spec=SimpleNamespace(harness=SimpleNamespace(version="2.4.6")))
    prepared = SimpleNamespace(minis={"a": mini}, run_dir=Path("run"))
    cfg = MatrixConfig({"a": object()}, train_in=["a"], rebuilt_of="a")
    arms = {"a": {"after": {"a": []}}, REBUILT: {"after": {"a": []}}}
    sliced = matrix.proxy_vs_rebuilt(prepared, cfg, {"a": []}, arms, {"a": {"trained_in": "a"}}, None, 0.0)
    assert (sliced["experiment"], sliced["table"]) == (table, table)


def test_the_heatmap_draws_the_newest_configuration_without_averaging_in_older_ones() -> None:
    from repro.report.harness_matrix_table import config_label, csv_rows
    from repro.report.plots import matrix_heatmap

    old = [_run(s, 0.9, 0.9) for s in (0, 1)]  # another configuration: other harnesses' fingerprints
    for run in old:
        run["fingerprints"] = {"h1": "g1", "h2": "g2"}
    new = [_run(s, 0.6, 0.4) for s in (0, 1)]
    assert config_label(old[0]) == config_label(old[1]) != config_label(new[0])
    frame = pd.DataFrame([row for run in old + new for row in csv_rows(run)])
    texts = [t.get_text() for t in matrix_heatmap(frame).axes[0].texts]
    assert "60.0%\n2 seed(s)" in texts and not any(t.startswith("75.0%") for t in texts)  # 75: averaged with old
    mixed = matrix_heatmap(frame.drop(columns="configuration")).axes[0].texts  # control: without the column
    assert any(t.get_text().startswith("75.0%") for t in mixed)


def test_the_command_line_quotes_an_override_the_shell_would_expand() -> None:
    import shlex

    from repro.report.cells import command_line

    arms = "context.arms=[{name:rollout,weighting:rollout},{name:fragment,weighting:fragment}]"
    line = command_line([{"seed": 0, "experiment": "context_training", "overrides": [arms, "tasks.seed=6"]}])
    assert line == f"repro run -m experiment=context_training '{arms}' tasks.seed=6 seed=0"
    assert arms in shlex.split(line)  # what bash hands repro: one override, not brace-expanded into several

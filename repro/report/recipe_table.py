"""``docs/recipe.md``: Agent Lightning's SWE recipe beside ``experiment=agl_swebench_qwen35_9b``, value by value.

Each :class:`Setting` (a row of ``recipe_settings.yaml``, beside this module) names Agent Lightning's value, where
it is written (file:line at the commits read), and the composed config's key. The table is rendered from the composed
experiment, so a changed value shows at once; a test regenerates it and compares with the committed file. A value
that differs must say why (:class:`Setting` ``why``); one that matches must not carry a stale reason. Settings
without a config key (the agent loop, the git guard) state the package's side in words and say whether it is the
same.

``python -m repro.report.recipe_table [OUT]`` writes the table (default ``docs/recipe.md``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

RECIPE = ["experiment=agl_swebench_qwen35_9b", "eval.checkpoint=QWEN35_9B_DIR",
          "train_tasks.source=TRAIN.jsonl", "val_tasks.source=VAL.jsonl"]
OUT = Path("docs/recipe.md")
SAME = "same"
SETTINGS_FILE = Path(__file__).with_name("recipe_settings.yaml")  # the repositories and files read, the settings


@dataclass(frozen=True)
class Setting:
    """One row: ``source`` is ``"file:line"`` or ``"file:first-last"`` with ``file`` a key of :data:`FILES`
    (several joined by ``", "``); ``key`` the composed config's dotted key, or None with ``ours`` in words."""

    group: str
    name: str
    agl: str  # Agent Lightning's value, as written there
    source: str
    key: str | None = None
    value: Any = None  # Agent Lightning's value in this package's terms (compared with the key's)
    ours: str = ""  # the package's side, when there is no key
    why: str = ""  # why the package differs ("" when it does not)
    note: str = ""  # how a matching value is reached, where the mechanism differs


def settings_of(groups: dict[str, list[dict[str, Any]]]) -> tuple[Setting, ...]:
    """The rows of ``recipe_settings.yaml``'s ``settings`` (per group, its settings), in table order."""
    return tuple(Setting(group, **entry) for group, entries in groups.items() for entry in entries)


_READ = yaml.safe_load(SETTINGS_FILE.read_text())
# Short names of the repositories read -> (GitHub repository, commit); of the files read -> (repository, path in it).
REPOS: dict[str, tuple[str, str]] = {name: tuple(repo) for name, repo in _READ["repositories"].items()}
FILES: dict[str, tuple[str, str]] = {name: tuple(file) for name, file in _READ["files"].items()}
AGL_COMMIT, VERL_COMMIT = REPOS["agl"][1], REPOS["verl"][1]
SETTINGS: tuple[Setting, ...] = settings_of(_READ["settings"])


def source_links(source: str) -> str:
    """``train:100, job:24-25`` -> markdown links to those lines at the commits read."""
    links = []
    for part in source.split(", "):
        name, lines = part.split(":")
        repo_key, path = FILES[name]
        repo, commit = REPOS[repo_key]
        first, _, last = lines.partition("-")
        anchor = f"#L{first}" + (f"-L{last}" if last else "")
        links.append(f"[{Path(path).name}:{lines}](https://github.com/{repo}/blob/{commit}/{path}{anchor})")
    return ", ".join(links)


def plain(value: Any) -> Any:
    """A composed value as plain python (lists for list nodes)."""
    if isinstance(value, ListConfig | DictConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def package_side(setting: Setting, cfg: DictConfig) -> tuple[str, str]:
    """(the package's side, same or why not) for one row; raises when a difference is not explained or a reason
    is stale."""
    if setting.key is None:
        return setting.ours, setting.why or SAME
    missing = object()
    ours = OmegaConf.select(cfg, setting.key, default=missing)
    if ours is missing:
        raise KeyError(f"recipe table: {setting.name!r} names {setting.key}, which the composed recipe lacks")
    ours = plain(ours)
    numeric = isinstance(ours, int | float) and not isinstance(ours, bool)
    same = ours == setting.value and (type(ours) is type(setting.value) or numeric)
    if same and setting.why:
        raise ValueError(f"recipe table: {setting.key} = {ours!r} matches Agent Lightning, but the row gives a "
                         f"reason it differs ({setting.why!r}): drop the reason")
    if not same and not setting.why:
        raise ValueError(f"recipe table: {setting.key} = {ours!r} differs from Agent Lightning's "
                         f"{setting.value!r} ({setting.source}) and the row does not say why")
    verdict = setting.why or (f"{SAME}: {setting.note}" if setting.note else SAME)
    return f"`{setting.key}` = `{ours!r}`", verdict


def render(cfg: DictConfig) -> str:
    """The markdown of ``docs/recipe.md`` for the composed recipe ``cfg``."""
    lines = [
        "# The reproduction recipe beside Agent Lightning's",
        "",
        "Generated by `python -m repro.report.recipe_table` from the composed `experiment=agl_swebench_qwen35_9b`; "
        "`tests/unit/test_recipe_table.py` fails when the config and this file disagree. Agent Lightning's values "
        f"were read at microsoft/agent-lightning@{AGL_COMMIT[:8]} (`examples/swe_smith/`, `agentlightning/verl/`) "
        f"and, where it does not override them, verl's defaults at volcengine/verl@{VERL_COMMIT[:9]}.",
        "",
        "| | parameter | Agent Lightning | source | this package | same, or why not |",
        "|---|---|---|---|---|---|",
    ]
    differ = 0
    for setting in SETTINGS:
        ours, verdict = package_side(setting, cfg)
        differ += not verdict.startswith(SAME)
        lines.append(f"| {setting.group} | {setting.name} | {setting.agl} | {source_links(setting.source)} | "
                     f"{ours} | {verdict} |")
    lines += ["", f"{len(SETTINGS)} settings, {differ} differ (each says why).", ""]
    return "\n".join(lines)


def composed_recipe() -> DictConfig:
    from repro.common.compose import compose_config  # here: Hydra's composition is only needed when rendering

    return compose_config(RECIPE)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else OUT
    out.write_text(render(composed_recipe()))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

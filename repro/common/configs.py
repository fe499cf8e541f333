"""Where `repro run`'s Hydra configs live (``repro/conf``, inside the package: a wheel ships them) and what they offer:
the experiments and every config group's options, listed from the files (no Hydra compose), for ``repro run --help``.
Stays light: the CLI builds its parser from it for every subcommand."""

from __future__ import annotations

import textwrap
from pathlib import Path

CONFIG_MODULE = "repro.conf"
CONFIG_PATH = f"pkg://{CONFIG_MODULE}"  # Hydra's search path entry for the package's config root
CONFIG_DIR = Path(__file__).resolve().parents[1] / "conf"
EXPERIMENT_GROUP = "experiment"


def config_groups(root: Path = CONFIG_DIR) -> dict[str, list[str]]:
    """Each config group (a folder under ``root``; nested ones as ``hydra/launcher``) and its options (its
    ``.yaml`` files' names), sorted."""
    groups: dict[str, list[str]] = {}
    for path in root.rglob("*.yaml"):
        if path.parent != root:
            groups.setdefault(path.parent.relative_to(root).as_posix(), []).append(path.stem)
    return {group: sorted(options) for group, options in sorted(groups.items())}


def group_defaults(root: Path = CONFIG_DIR) -> dict[str, str]:
    """The option each group takes when the command line names none (``config.yaml``'s defaults list)."""
    import yaml

    defaults = (yaml.safe_load((root / "config.yaml").read_text()) or {}).get("defaults", [])
    return {group: str(option) for item in defaults if isinstance(item, dict) for group, option in item.items()}


def _wrapped(options: list[str], default: str | None, indent: int) -> str:
    names = [f"{name}*" if name == default else name for name in options]
    return textwrap.fill(", ".join(names), width=110, initial_indent=" " * indent,
                         subsequent_indent=" " * indent).lstrip()


def run_help(root: Path = CONFIG_DIR) -> str:
    """The experiments and every other config group with its options, as Hydra apps list them (* = default)."""
    groups = config_groups(root)
    defaults = group_defaults(root)
    experiments = groups.pop(EXPERIMENT_GROUP, [])
    width = max((len(group) for group in groups), default=0) + 2
    lines = [f"experiments (experiment=NAME; * = default; the comment atop {EXPERIMENT_GROUP}/NAME.yaml says what "
             "it runs):", "  " + _wrapped(experiments, defaults.get(EXPERIMENT_GROUP), 2), "",
             "config groups (GROUP=OPTION; * = default):"]
    lines += [f"  {group + ':':<{width}}" + _wrapped(options, defaults.get(group), width + 2)
              for group, options in groups.items()]
    lines += ["", "Any key can be set too (key=value, e.g. proxy.port=0); an experiment may pick other defaults.",
              "`repro run --cfg job experiment=NAME` prints its composed config without running it.",
              f"Config files: {root}"]
    return "\n".join(lines)


def split_table_name(name: str, split: str | None) -> str:
    """The name a run of ``name`` on ``split`` goes under: ``<name>_validation`` on the validation split (its own
    folder and table: a validation run never joins its experiment's test table), else ``name``."""
    return f"{name}_validation" if split == "validation" and not name.endswith("_validation") else name

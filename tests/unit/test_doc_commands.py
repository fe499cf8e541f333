"""Every ``repro ...`` command that README.md and docs/ show parses as a shell would split it: the command line's
parser accepts it, and each ``repro run`` / ``repro plan`` / ``repro images build`` composes its Hydra config (a
sweep: its first cell) and builds its job's configs. A usage line's placeholders (``RUN_DIR``, ``[--phase P]``,
``<time>``) are filled with sample values first. An example that cannot parse (unquoted braces in a Hydra list, an
override of a key that does not exist) fails here, not in a reader's shell."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import instantiate
from omegaconf import DictConfig

from repro.cli.commands import build_parser
from repro.common.compose import compose_config

ROOT = Path(__file__).parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SUBCOMMANDS = {"run", "table", "inspect", "report", "proxy", "serve", "build-model", "tasks", "images", "plan"}
COMPOSED = {"run", "plan", "images"}  # subcommands whose positional words are Hydra overrides
PLACEHOLDERS = {  # a usage line's placeholder -> a value that parses
    "RUN_DIR": "outputs/x", "RUN": "outputs/x", "ROLLOUT": "r1", "ROLLOUT_OR_INSTANCE": "r1", "ID": "toy-1",
    "DIR": "/tmp/x", "URL": "http://127.0.0.1:8000/v1", "N": "1", "NAME": "mini_repro", "LAYOUT": "h100_x8",
    "T": "H100", "G": "1", "R": "1", "S": "1", "C": "1", "P": "1", "ROWS": "rows.jsonl", "SWE_SMITH.jsonl": "s.jsonl",
    "QWEN35_9B_DIR": "/tmp/x", "M": "per_call", "W": "rollout", "O": "resolved", "U": "http://127.0.0.1:8000/v1",
}


def shell_lines(text: str) -> list[str]:
    """The lines of the shell blocks (```bash / ```sh / ```console / ```), continuation lines joined."""
    lines, fence = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            fence = line[3:].strip() if fence is None else None
            continue
        if fence in ("bash", "sh", "console"):
            lines.append(line)
    return re.sub(r"\\\n\s*", " ", "\n".join(lines)).splitlines()


def documented_commands() -> list[tuple[str, str]]:
    """(where, command) for every ``repro <subcommand> ...`` in a code span or a shell block of the docs."""
    found = []
    for path in DOCS:
        text = path.read_text()
        spans = re.findall(r"(?<!`)`(repro [^`]+)`", text)
        lines = [m.group(1) for line in shell_lines(text)
                 if (m := re.match(r"^\s*(?:[A-Z_]+=\S+ )*(?:\.venv/bin/)?(repro .*?)\s*(?:#.*)?$", line))]
        for command in spans + lines:
            command = " ".join(command.split())
            if command.split()[1] in SUBCOMMANDS:
                found.append((path.name, command))
    return sorted(set(found))


def concrete(command: str) -> list[str]:
    """The command's words after ``repro``, as a shell splits them: placeholders filled, optional parts
    (``[--flag X]``, ``[experiment=NAME]``) kept without their brackets, repeats (``[key=value ...]``) dropped;
    ``a | b`` and ``a|b`` alternatives: the first; a trailing ``&``: dropped."""
    command = command.split(" / ")[0].split(r" \| ")[0].removesuffix(" &")
    command = re.sub(r"<[^>]*>", "20261201-000000", command)
    command = re.sub(r" \[[^\]]*\.\.\.\]", "", command)
    command = re.sub(r" \[([^\]]*)\]", r" \1", command)
    words = [w.split("|")[0] if "|" in w and "=" not in w else w for w in shlex.split(command)[1:]]
    return [PLACEHOLDERS.get(w, w) if "=" not in w else
            w.split("=", 1)[0] + "=" + PLACEHOLDERS.get(w.split("=", 1)[1], w.split("=", 1)[1]) for w in words]


def first_cell(overrides: list[str]) -> list[str]:
    """A sweep's first combination (the overrides as given when nothing sweeps); Hydra's own parser, so a bad
    override raises here as it would in ``repro run``."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    return [f"{o.get_key_element()}={next(iter(o.sweep_string_iterator()))}" if o.is_sweep_override()
            else o.input_line for o in parsed]


COMMANDS = documented_commands()


def test_the_docs_show_the_commands_this_test_checks() -> None:
    where = {w for w, _ in COMMANDS}
    kinds = {c.split()[1] for _, c in COMMANDS}
    assert {"README.md", "architecture.md", "reproduction.md"} <= where and {"run", "table", "plan"} <= kinds
    assert any("harness=command" in c and "{task_file}" in c for _, c in COMMANDS)  # the bring-your-own example


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[f"{w}:{c[:70]}" for w, c in COMMANDS])
def test_a_documented_command_parses_and_composes(where: str, command: str) -> None:
    words = concrete(command)
    if "--help" in words or len(words) == 1:  # a help page, or the command named in prose
        return
    args = build_parser().parse_args(words)
    if words[0] not in COMPOSED or not getattr(args, "overrides", None):
        return
    cfg = compose_config(first_cell(args.overrides))
    if getattr(args, "cfg", None) or words[0] != "run":
        return
    for key, node in cfg.job.items():
        if isinstance(node, DictConfig) and "_target_" in node:
            assert instantiate(node, _convert_="all") is not None, key


def test_the_check_fails_on_the_unquoted_braces_hydra_refuses() -> None:
    bad = "repro run experiment=eval_bundled harness=command 'harness.command=[python3,a.py,{task_file}]'"
    good = "repro run experiment=eval_bundled harness=command 'harness.command=[python3,a.py,\"{task_file}\"]'"
    with pytest.raises(Exception, match="no viable alternative"):
        first_cell(concrete(bad)[1:])
    assert first_cell(concrete(good)[1:])[-1].endswith('"{task_file}"]')


UPSTREAM_PATHS = {  # paths in other projects that the docs cite, and files a run writes
    "docs/features/sleep_mode.md", "examples/swe_smith/agents/smith_agent.py", "examples/swe_smith/",
    "docs/start/multinode.rst", "config/extra/swebench.yaml", "minisweagent/config/benchmarks/swebench.yaml",
    "run/extra/swebench_single.py", "policy/rl_step.json", "./name.py",
}


def test_every_file_the_docs_name_exists() -> None:
    """A path in backticks (``repro/rl/loop.py``, or short: ``rl/loop.py``) names a file of this repository: a moved
    or renamed module leaves no stale path behind."""
    pattern = re.compile(r"`([\w.-]+/[\w./-]*\.(?:py|md|yaml|sh|csv|svg|json|rst))`")
    missing = sorted({(path.name, p) for path in DOCS for p in pattern.findall(path.read_text())
                      if not any(ch in p for ch in "*<>{}X") and p not in UPSTREAM_PATHS
                      and not any((ROOT / pre / p).exists() for pre in ("", "repro", "harness_adapters", "tests"))})
    assert not missing, missing

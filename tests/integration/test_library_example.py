"""The README's "Use it as a library" example runs as written: a harness of the user's own trained with the public
RLTrainer (real CPU server, proxy, local sandbox, SQLite), then the trained policy evaluated in it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def library_example() -> str:
    """The first ```python block of the README's "Use it as a library" section."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Use it as a library", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, "the README's library section has no python block"
    return blocks[0]


def test_the_section_holds_a_harness_of_its_own_and_the_public_api() -> None:
    code = library_example()
    assert "from repro import" in code and "RLTrainer(" in code and ".fit()" in code and ".evaluate(" in code
    assert "def run(self, rollouts" in code  # the harness contract, implemented in the example itself
    assert len(code.strip().splitlines()) <= 45  # the short form: a harness, then construct, fit, evaluate


@pytest.mark.e2e
def test_the_readme_library_example_trains_and_evaluates(tmp_path: Path) -> None:
    (tmp_path / "example.py").write_text(library_example())
    out = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "outputs" / "sed_agent"
    records = [json.loads((run / "rl" / f"step_{s:03d}" / "step_record.json").read_text()) for s in (0, 1)]
    assert [r["rollouts"] for r in records] == [8, 8]  # 2 tasks x 4 samples a step, every one recorded
    assert all(r["reload_check"]["passed"] for r in records)  # each update reached the server
    assert len(list((run / "eval_trained" / "instances").iterdir())) == 4  # one report folder per task
    assert out.stdout.strip().splitlines()[-1].endswith("resolved")

"""`repro report` on real runs, looked at in a real browser (headless chromium over the DevTools protocol).

Two real frozen evaluations of the same spec (so the same fingerprint): the scripted expert served as the model
(solves a task) and the tiny untrained model (fails it). The report of both must show the table rows, the plots and
that task's failed and solved rollouts side by side, and log no errors. ``REPRO_WRITE_SCREENSHOT=docs/report.png``
saves the screenshot the README shows.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.tasks.loaders import write_tasks
from tests.browser_support import Page, chromium, small_png

pytestmark = pytest.mark.e2e  # a whole `repro run` (and a wheel build / a browser) on a real stack

REPO = Path(__file__).parents[2]
WIDTH, HEIGHT = 1280, 1200
TASKS = TaskDistributionConfig(seed=0, split="test", n_tasks=2, families=["procedural"], difficulty="one_step")
COMMON = ["experiment=eval_bundled", "tasks.n_tasks=2", "tasks.families=[procedural]", "eval.k=2",
          "eval.max_tokens=256", "eval.concurrency=2"]


def _repro(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "repro.cli.commands", *args], capture_output=True, text=True,
                          timeout=900, cwd=REPO)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """(expert run, tiny-model run): same frozen spec, the expert solves what the tiny model fails."""
    chromium()  # skip (or fail under REPRO_REQUIRE_BROWSER=1) before running anything
    root = tmp_path_factory.mktemp("report-runs")
    expert_tasks = write_tasks(build_distribution(TASKS), root / "expert.jsonl")
    for name, extra in (("expert", [f"serving.expert_tasks={expert_tasks}"]), ("tiny", [])):
        out = _repro("run", *COMMON, f"run.output_root={root}", f"run.name={name}", *extra)
        assert out.returncode == 0, out.stderr[-3000:]
    return [next((root / name).iterdir()) for name in ("expert", "tiny")]


CHECKS = """(() => {
  const seen = (el) => {
    if (!el) return null;
    el.scrollIntoView({block: "center"});
    const r = el.getBoundingClientRect();
    return {w: r.width, h: r.height, left: r.left, top: r.top,
            inView: r.bottom > 0 && r.right > 0 && r.top < innerHeight && r.left < innerWidth};
  };
  const pair = document.querySelector(".pair");
  const img = document.querySelector("#plots img");
  const out = {table: seen(document.querySelector("#rows table")), plot: seen(img),
               plotPixels: img ? img.naturalWidth : 0, plots: document.querySelectorAll("#plots img").length,
               failed: seen(pair && pair.querySelector(".head.failed")),
               solved: seen(pair && pair.querySelector(".head.solved")),
               pairCells: pair ? pair.querySelectorAll(".cell").length : 0,
               pairTask: pair ? pair.parentElement.querySelector("h3").textContent : "",
               external: performance.getEntriesByType("resource").map(e => e.name)
                 .filter(n => !n.startsWith("file:"))};
  window.scrollTo(0, 0);
  return out;
})()"""


async def _look(url: str, rollout_url: str) -> tuple[dict, dict, bytes, list[str]]:
    async with Page(chromium(), WIDTH, HEIGHT) as page:
        await page.open(url)
        found = await page.evaluate(CHECKS)
        shot = await page.screenshot()
        await page.open(rollout_url)
        rollout = await page.evaluate("""(() => { const m = document.querySelector('.mask');
            m.scrollIntoView(); const r = m.getBoundingClientRect();
            return {w: r.width, h: r.height, rows: document.querySelectorAll('.mask').length}; })()""")
        return found, rollout, shot, page.errors


def _visible(box: dict | None) -> bool:
    return bool(box) and box["w"] > 0 and box["h"] > 0 and box["inView"]


def test_report_of_real_runs_in_a_browser(two_runs: list[Path], tmp_path: Path) -> None:
    out = _repro("report", *map(str, two_runs), "--out", str(tmp_path / "report"))
    assert out.returncode == 0, out.stderr[-3000:]
    index = tmp_path / "report" / "index.html"
    html = index.read_text()
    assert "src=\"http" not in html and "href=\"http" not in html  # nothing fetched: opens from disk
    reports = [json.loads(p.read_text()) for run in two_runs for p in run.glob("instances/*/sample-*/report.json")]
    solved = {r["instance_id"] for r in reports if r["outcome"] == "resolved"}
    failed = {r["instance_id"] for r in reports if r["outcome"] == "unresolved"}
    assert solved & failed, "the runs give no task with both a solved and a failed rollout"
    rollout_page = tmp_path / "report" / "rollouts"
    pages = sorted(rollout_page.glob("*.html"))
    assert pages, "no rollout pages"
    found, rollout, shot, errors = asyncio.run(_look(index.as_uri(), pages[0].as_uri()))
    assert errors == [], errors
    assert found["external"] == []
    assert _visible(found["table"]) and _visible(found["plot"]) and found["plotPixels"] > 0
    assert found["plots"] >= 3  # before/after per instance, pass@k, calls per rollout
    assert _visible(found["failed"]) and _visible(found["solved"]), found
    failed_box, solved_box = found["failed"], found["solved"]  # side by side: one row, failed on the left
    assert failed_box["left"] < solved_box["left"] and abs(failed_box["top"] - solved_box["top"]) < 2
    assert found["pairCells"] >= 6  # two heads, at least one turn each, two verdicts
    assert rollout["rows"] >= 1 and rollout["w"] > 0 and rollout["h"] > 0  # calls -> rows: the token mask strip
    assert found["pairTask"].removeprefix("task ") in solved & failed
    target = os.environ.get("REPRO_WRITE_SCREENSHOT")
    if target:
        path = small_png(shot, Path(target))
        assert path.stat().st_size < 300_000

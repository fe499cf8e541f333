"""Hydra callbacks at the end of a multirun: the sweep's table printed and written beside its runs (``sweep.md``),
its failed jobs listed under it. ``SweepTableCallback``: the harness x task matrix (``repro.report.sweep_table``);
``SeedsTableCallback``: the miniature's seeds and their pooled row."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from repro.report.before_after import run_markdown
from repro.report.loop_comparison_table import comparison_markdown
from repro.report.run_records import ERROR_FILE
from repro.report.sweep_table import sweep_markdown
from repro.report.tables import find_metrics


def failed_jobs(sweep_dir: Path) -> list[dict[str, Any]]:
    """The ``error.json`` records of the sweep's failed jobs, by job number."""
    records = [json.loads(p.read_text()) for p in sweep_dir.glob(f"*/{ERROR_FILE}")]
    return sorted(records, key=lambda r: r["job"])


def failures_markdown(failed: list[dict[str, Any]]) -> str:
    lines = ["## Failed jobs (no cell)", ""]
    lines += [f"- #{r['job']} `{' '.join(r['overrides'])}`: {r['error']}" for r in failed]
    return "\n".join(lines) + "\n"


def none_drawn(found: list[dict[str, Any]]) -> str:
    """What the sweep table says when it draws none of the sweep's runs: that none finished, or which kinds did
    (an experiment with a table of its own, e.g. ``context_training``, which ``repro table`` publishes)."""
    if not found:
        return "No finished runs (no metrics.json).\n"
    kinds = Counter(str(m.get("kind", "?")) for m in found)
    listed = ", ".join(f"{n} of kind `{kind}`" for kind, n in sorted(kinds.items()))
    return f"Finished runs: {listed}. This sweep table draws none of them; `repro table` publishes them.\n"


class _SweepCallback(Callback):
    """Knows the sweep's directory at its end. ``hydra.sweep.dir`` holds ``${now:...}``, which resolves again (to
    a later time) when read at the end, so the directory is taken from the jobs that ran."""

    def __init__(self) -> None:
        self._seen: set[Path] = set()

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        hydra_cfg = getattr(job_return, "hydra_cfg", None)
        if hydra_cfg is None:
            return
        path = OmegaConf.select(hydra_cfg, "hydra.runtime.output_dir") or \
            OmegaConf.select(hydra_cfg, "runtime.output_dir")
        if path:
            self._seen.add(Path(path).parent)

    def sweep_dir(self, config: DictConfig) -> Path:
        """The sweep directory: the jobs' parent, else the configured one, else the newest sibling sweep."""
        if len(self._seen) == 1:
            return next(iter(self._seen))
        configured = Path(config.hydra.sweep.dir)
        if configured.exists():
            return configured
        sweeps = sorted(configured.parent.glob("*/multirun.yaml"), key=lambda p: p.stat().st_mtime)
        return sweeps[-1].parent if sweeps else configured


class SweepTableCallback(_SweepCallback):
    """At the end of a Hydra multirun: the matrix of this sweep's runs, printed and written to ``sweep.md``;
    failed jobs are listed under it and make the command exit non-zero."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = self.sweep_dir(config)
        found = [{**m, "run_dir": m.get("run_dir", str(p.parent))} for p, m in find_metrics(sweep_dir)]
        runs = [m for m in found if m.get("kind") == "eval"]
        text = sweep_markdown(runs[-1].get("table") or runs[-1]["experiment"], runs) if runs else \
            f"# sweep {sweep_dir}\n\n{none_drawn(found)}"
        publish_sweep(sweep_dir, text, len(found))


def publish_sweep(sweep_dir: Path, text: str, finished: int) -> None:
    """Write ``sweep.md`` (with the failed jobs listed) and print it; SystemExit when a job failed."""
    failed = failed_jobs(sweep_dir)
    if failed:
        text += "\n" + failures_markdown(failed)
    (sweep_dir / "sweep.md").write_text(text)
    print(text, flush=True)
    if failed:
        raise SystemExit(f"{len(failed)} of {len(failed) + finished} sweep jobs failed (see {sweep_dir}/sweep.md)")


class SeedsTableCallback(_SweepCallback):
    """At the end of a multirun of the miniature (``seed=0,1,2``): the table of this sweep's runs, one row per seed
    and the pooled row, printed and written to ``sweep.md``; failed jobs are listed and make the exit non-zero."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = self.sweep_dir(config)
        found = [{**m, "run_dir": m.get("run_dir", str(p.parent))} for p, m in find_metrics(sweep_dir)]
        before_after = [m for m in found if m.get("kind") == "before_after"]
        comparisons = [m for m in found if m.get("kind") == "loop_comparison"]
        parts = [f"# sweep {sweep_dir.name}", ""]
        if before_after:
            parts.append(run_markdown(before_after))
        if comparisons:
            parts.append(comparison_markdown(comparisons))
        if not before_after and not comparisons:
            parts.append(none_drawn(found))
        publish_sweep(sweep_dir, "\n".join(parts), len(found))


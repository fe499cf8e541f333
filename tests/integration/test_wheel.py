"""The package as a wheel: built from the checkout, it holds every config and data file, and installed into a fresh
venv it runs `repro run experiment=smoke` (tiny model, CPU server, proxy, the real mini-SWE-agent) from a directory
outside the checkout, with its own code and configs.

The fresh venv gets the wheel only (``--no-deps``, offline); the dependencies come from this interpreter's
site-packages through a ``.pth`` line. A directory added by a ``.pth`` line does not have its own ``.pth`` files
processed, so an editable install of the checkout there stays invisible (checked: ``repro`` imports from the venv).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # a whole `repro run` (and a wheel build / a browser) on a real stack

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("repro", "harness_adapters", "repro_taskdata")
BUILD_INPUTS = ("pyproject.toml", "README.md")
NO_CACHE = shutil.ignore_patterns("__pycache__", "*.pyc")


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
         ) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out


def _package_files(root: Path) -> set[str]:
    """The files of the packages under ``root``, as wheel paths."""
    return {path.relative_to(root).as_posix() for package in PACKAGES for path in (root / package).rglob("*")
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built (offline, no build isolation) from a copy of the checkout's packages and build files."""
    src = tmp_path_factory.mktemp("src")
    for name in BUILD_INPUTS:
        shutil.copy2(ROOT / name, src / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, src / package, ignore=NO_CACHE)
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w",
          str(dist), str(src)], cwd=src)
    (built,) = dist.glob("repro-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel, with this interpreter's site-packages (the dependencies) on its path."""
    root = tmp_path_factory.mktemp("venv") / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(root)], cwd=root.parent)
    python = root / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
          str(wheel)], cwd=root.parent)
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=root.parent).stdout.strip())
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (site / "repro-test-dependencies.pth").write_text("".join(f"{path}\n" for path in ours))
    return root


def _env() -> dict[str, str]:
    """This environment without anything that would put the checkout on the path."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def test_the_wheel_holds_every_config_and_data_file(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(_package_files(ROOT) - names)
    assert not missing, missing
    assert {"repro/conf/config.yaml", "repro/conf/experiment/smoke.yaml", "repro/conf/hydra/launcher/slurm.yaml",
            "repro_taskdata/packages/strkit/tests/test_strkit.py", "repro/tinymodel/chat_template.jinja",
            "harness_adapters/mini_swe_agent/worker.py"} <= names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_the_installed_wheel_runs_the_smoke_experiment_outside_the_checkout(venv: Path, tmp_path: Path) -> None:
    python, repro = venv / "bin" / "python", venv / "bin" / "repro"
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = _env()
    where = _run([str(python), "-c", "import repro, harness_adapters; print(repro.__file__); "
                  "print(harness_adapters.__file__)"], cwd=work, env=env).stdout.split()
    assert all(Path(path).is_relative_to(venv) for path in where), where

    helped = _run([str(repro), "run", "--help"], cwd=work, env=env).stdout
    assert "smoke" in helped and f"Config files: {venv}" in helped  # the listing reads the wheel's configs
    shown = _run([str(repro), "run", "--cfg", "job", "experiment=smoke"], cwd=work, env=env).stdout
    assert "_target_: repro.experiments.smoke.smoke_job" in shown and not (work / "outputs").exists()

    out = _run([str(repro), "run", "experiment=smoke", "harness.step_limit=2"], cwd=work, env=env, timeout=600)
    (metrics_path,) = work.glob("outputs/smoke/*/metrics.json")
    metrics = json.loads(metrics_path.read_text())
    assert metrics["harness"]["status"] == "finished", out.stdout[-2000:]
    assert metrics["calls"] == metrics["harness_reported_calls"] >= 1
    assert "calls of rollout smoke-0" in out.stdout
    manifest = json.loads((metrics_path.parent / "manifest.json").read_text())
    assert manifest["git_sha"] is None  # an installed package is no checkout: nothing to record, no error

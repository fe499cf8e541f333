"""The CLI stays light: building its parser (which every command does) and running the proxy import neither the
model-serving stack (torch, transformers, the CPU server) nor swebench (seconds to import) nor Hydra."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "swebench", "datasets", "trl", "vllm", "hydra", "repro.serving.engine",
         "repro.serving.cpu_server", "repro.experiments", "repro.tinymodel")

# Runs `repro ARGS` in this interpreter and prints the modules it imported once it is done (help) or serving (the
# proxy: once /health answers), as JSON on the last line of stdout.
PROBE = """
import json, os, sys, threading, time, urllib.request
from repro.cli.commands import main

def report():
    print(json.dumps(sorted(sys.modules)), flush=True)
    os._exit(0)

def when_serving(port):
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return report()
        except OSError:
            time.sleep(0.05)
    os._exit(3)

args = sys.argv[1:]
if "--port" in args:
    threading.Thread(target=when_serving, args=(args[args.index("--port") + 1],), daemon=True).start()
try:
    main(args)
except SystemExit:
    pass
report()
"""


def imported_by(args: list[str], probe: str = PROBE, **extra_env: str) -> set[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **extra_env}
    out = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, env=env, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


@pytest.mark.parametrize("args", [["proxy", "--help"], ["--help"], ["run", "--help"], ["tasks", "list", "--help"]])
def test_help_imports_no_heavy_module(args: list[str]) -> None:
    modules = imported_by(args)
    assert "repro.cli.commands" in modules and "argparse" in modules  # the probe saw the command run
    assert heavy(modules) == []
    assert [m for m in modules if m.split(".")[0] == "numpy" or m.startswith("repro.store")] == []  # help: no store


def test_a_running_proxy_imports_no_heavy_module(tmp_path: Path) -> None:
    from repro.common.net import free_port

    modules = imported_by(["proxy", "--port", str(free_port()), "--store", str(tmp_path / "traces.sqlite"),
                           "--upstream-url", "http://127.0.0.1:9"], REPRO_PROXY_CONTROL_TOKEN="t" * 43)
    assert "uvicorn" in modules and "repro.proxy.app" in modules  # it was serving
    assert heavy(modules) == []


def test_the_check_sees_a_heavy_import() -> None:
    assert heavy({"torch", "argparse", "hydra.core", "repro.serving.commands"}) == ["hydra.core", "torch"]


def test_the_inspect_choices_import_neither_the_store_nor_numpy() -> None:
    """The parser reads ``repro inspect``'s choices from repro.train.samples: that import stays free of the trace store
    (whose package imports numpy) and of rich."""
    modules = imported_by([], "import json, sys\nfrom repro.train.samples import MODES, WEIGHTINGS, SampleConfig\n"
                              "print(json.dumps(sorted(sys.modules)))")
    assert {"repro.train.samples.rows", "repro.train.samples.build"} <= modules
    assert [m for m in modules if m.split(".")[0] in ("numpy", "rich") or m.startswith("repro.store")] == []

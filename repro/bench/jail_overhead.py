"""``python -m repro.bench.jail_overhead``: what a rollout's jail costs (:mod:`repro.execution.jail`): the seconds to
start a command in a fresh jail (namespaces, the new root, ``/proc``, the relay) against the same command run
directly, and the extra latency of one HTTP request through the jail's relay to a local server. Prints medians and
90th percentiles over ``--n`` runs, interleaved."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from repro.execution.jail import Jail, jail_available
from repro.net import free_port, wait_for_http

FETCH = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10).read()"


def _timed(cmd: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    return time.perf_counter() - started


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median_ms": round(statistics.median(ordered) * 1000, 1),
            "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))] * 1000, 1)}


def measure(n: int) -> dict[str, object]:
    why = jail_available()
    if why is not None:
        raise SystemExit(f"no jail on this machine: {why}")
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="jail-bench-"))
    (work / "f").write_text("x")
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory",
                               str(work)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/f", 30, server)
        url = f"http://127.0.0.1:{port}/f"
        rows: dict[str, list[float]] = {"true_direct": [], "true_jailed": [], "fetch_direct": [], "fetch_jailed": []}
        env = {"PATH": "/usr/bin:/bin"}
        for _ in range(n):
            with Jail(read_write=[str(work)], proxy_url=f"http://127.0.0.1:{port}") as jail:
                rows["true_jailed"].append(_timed(jail.command(["/bin/true"], work, env)))
                rows["true_direct"].append(_timed(["/bin/true"]))
                rows["fetch_jailed"].append(_timed(jail.command([sys.executable, "-c", FETCH, url], work, env)))
                rows["fetch_direct"].append(_timed([sys.executable, "-c", FETCH, url]))
    finally:
        server.kill()
    return {"n": n, **{name: _summary(values) for name, values in rows.items()}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m repro.bench.jail_overhead", description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=30)
    print(json.dumps(measure(parser.parse_args(argv).n), indent=2))


if __name__ == "__main__":
    main()

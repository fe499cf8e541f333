"""`repro images build` builds one image per task of an experiment's task sets once, then finds them cached."""

from __future__ import annotations

from repro.cli.commands import main
from tests.docker_support import docker_engine


def test_images_build_builds_then_finds_the_experiments_images_cached(capsys) -> None:
    docker_engine()
    overrides = ["experiment=eval_bundled", "tasks.n_tasks=3", "tasks.seed=7"]
    main(["images", "build", *overrides])
    main(["images", "build", *overrides])
    lines = [line for line in capsys.readouterr().out.splitlines() if "task images" in line]
    assert len(lines) == 2 and "3 task images" in lines[0] and "(0 built, 3 cached)" in lines[1], lines

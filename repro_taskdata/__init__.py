"""Data shipped with ``repro``: the hand-written task packages (``packages/<name>/``: a small Python project with its
own tests, a repository root each) that the bundled task families mutate. Data, not code: nothing here is
imported; :mod:`repro.tasks.bundled` reads the files."""

from pathlib import Path

PACKAGES_DIR = Path(__file__).parent / "packages"

__all__ = ["PACKAGES_DIR"]

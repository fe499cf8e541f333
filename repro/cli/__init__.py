"""The command line: `repro run | table | inspect | report | proxy | serve | build-model | tasks | images | plan`
(:func:`main`, in :mod:`repro.cli.app`)."""

from repro.cli.app import main

__all__ = ["main"]

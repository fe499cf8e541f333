"""The command line: `repro run | table | inspect | report | proxy | serve | build-model | tasks | images | plan`
(:func:`main`, in :mod:`repro.cli.commands`)."""

from repro.cli.commands import main

__all__ = ["main"]

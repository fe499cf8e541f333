"""The building blocks the experiments share: job setup, the warm start, the miniature's phases, paired metrics of
before/after runs and the memory gate. Each ``repro/experiments/X.py`` is one experiment built from them."""

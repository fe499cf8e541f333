"""``python -m repro.testing --port N``: serve the fake vLLM upstream (used by the proxy benchmark)."""

from repro.testing.fake_upstream import main

main()

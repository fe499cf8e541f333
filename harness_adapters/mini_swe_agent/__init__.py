"""mini-SWE-agent, unchanged, as a harness: 2.x through long-lived workers (`pool.py` drives `worker.py`, which runs
inside the harness's own environment; `wire.py` is their request and report; `jailed.py` puts its commands in the
rollout's jail), 1.x one `mini` per rollout (`v1.py`, `v1_docker.py`); `adapter.py` holds the config and the
one-rollout CLI adapter, `outcome.py` what a run ended with."""

"""Adapters that run real, unmodified agent harnesses, each from its own isolated, cached environment.

- ``envs``: build and cache one virtual environment per (harness, version).
- ``mini_swe_agent``: one mini-SWE-agent rollout as a subprocess pointed at an OpenAI-compatible URL.
- ``pool`` / ``worker``: the ``Harness`` contract, many rollouts per long-lived
  worker process.
- ``mini_swe_agent_v1``: the ``Harness`` contract for mini-SWE-agent 1.x (text mode), one ``mini`` per rollout.
- ``registry``: harnesses by name (``get_harness``, by version too), imported lazily.
"""

from repro.common.venvs import HarnessEnv, HarnessEnvError, ensure_harness_env

__all__ = ["HarnessEnv", "HarnessEnvError", "ensure_harness_env"]

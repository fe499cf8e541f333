"""The stack of ``trainer=verl`` on GPUs, without a GPU: the recording proxy in front of verl's vLLM replicas (here
fake vLLM-dialect upstreams), a rollout's calls pinned to one replica, weights pushed by verl's actor (here a
callable) and checked by the weight probe after the push only (the replicas sleep through the update)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from repro.common.net import free_port
from repro.proxy import ProxyConfig
from repro.proxy.config import replica_index
from repro.serving.stack import verl_stack
from repro.serving.weight_probe import StaleWeightsError
from repro.store import open_store
from repro.testing import FakeVllmUpstream, ServerThread


def _chat(url: str) -> int:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(f"{url}/chat/completions", json=body, timeout=10).status_code


def test_verl_stack_pins_rollouts_and_syncs_through_verl(tmp_path: Path, tiny_model_dir: Path) -> None:
    apps = [FakeVllmUpstream(completion_tokens=4) for _ in range(2)]
    pushed: list[list[int]] = []

    def push() -> float:  # what VerlPolicy.sync_rollout does; records what the replicas had answered before it
        pushed.append([app.requests for app in apps])
        return 0.25

    with ServerThread(apps[0], free_port()) as a, ServerThread(apps[1], free_port()) as b, \
            verl_stack(tiny_model_dir, [a.url, b.url], "served", push, ProxyConfig(port=0), tmp_path) as stack:
        assert stack.server_kind == "verl" and stack.proxy.upstream_replicas == [b.url]
        for rollout in ("r-a", "r-b", "r-c", "r-d"):
            base = stack.client.register(rollout_id=rollout)
            before = [app.requests for app in apps]
            assert _chat(base) == 200
            assert [app.requests - was for app, was in zip(apps, before, strict=True)] == \
                [int(i == replica_index(rollout, 2)) for i in range(2)]
        answered = [app.requests for app in apps]
        seconds = stack.sync_weights(tiny_model_dir, version=3, scorer=lambda prompt, ids: [-0.5] * len(ids))
        assert seconds == 0.25 and pushed == [answered]  # no probe before the push: the replicas were asleep
        assert sum(app.requests for app in apps) == sum(answered) + 1  # the probe, after
        assert stack.reload_checks[-1].passed and stack.reload_checks[-1].moved is None
        assert _chat(stack.client.base_url("r-a")) == 200
        assert [c.policy_version for c in open_store(tmp_path / "traces.sqlite").calls("r-a")] == [None, 3]
        with pytest.raises(StaleWeightsError):  # the control: served logprobs that are not the actor's stop the run
            stack.sync_weights(tiny_model_dir, version=4, scorer=lambda prompt, ids: [-2.0] * len(ids))
        assert len(pushed) == 2


def test_verl_stack_without_replicas_is_refused(tmp_path: Path, tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="no rollout replicas"), \
            verl_stack(tiny_model_dir, [], "served", lambda: 0.0, ProxyConfig(port=0), tmp_path):
        pass

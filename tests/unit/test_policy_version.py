"""The policy version of every recorded call: the trainer tells the proxy which weights the server holds after each
sync (POST /policy_version), every call that starts afterwards records it, and a step's stale calls are countable."""

from __future__ import annotations

import httpx

from repro.serving.stack import Stack
from tests.support import RunningProxy


def _call(base: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(f"{base}/chat/completions", json=body, timeout=10).status_code == 200


def test_calls_record_the_version_set_before_they_start(proxy: RunningProxy) -> None:
    base = proxy.new_rollout("r1")
    _call(base)  # before any sync: no version
    stack = Stack(model_dir=None, server_url="", proxy_url=proxy.url, proxy=proxy.config, served_model_name="m")
    stack.set_policy_version(0)
    _call(base)
    assert httpx.post(f"{proxy.url}/policy_version", json={"version": 3}, headers=proxy.client.headers).json() == \
        {"policy_version": 3}
    _call(base)
    other = proxy.new_rollout("r2")
    _call(other)
    store = proxy.store()
    assert [c.policy_version for c in store.calls("r1")] == [None, 0, 3]
    assert store.policy_versions(["r1", "r2"]) == {None: 1, 0: 1, 3: 2}
    assert store.policy_versions([]) == {}


def test_a_bad_version_is_a_400_and_changes_nothing(proxy: RunningProxy) -> None:
    base = proxy.new_rollout("r3")
    proxy.client.set_policy_version(2)
    for bad in ({"version": -1}, {"version": "2"}, {"version": True}, {}):
        resp = httpx.post(f"{proxy.url}/policy_version", json=bad, headers=proxy.client.headers)
        assert resp.status_code == 400 and "non-negative integer" in resp.text
    _call(base)
    assert [c.policy_version for c in proxy.store().calls("r3")] == [2]

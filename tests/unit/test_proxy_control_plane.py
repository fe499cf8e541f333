"""What a rollout's agent can do at the proxy with only what it is given (its base URL, in OPENAI_BASE_URL and
ANTHROPIC_BASE_URL, and a dummy API key): nothing but its own rollout's model calls. Every control request is
refused and changes nothing in the store; the same requests with the job's control token succeed (the control:
the refusal is the guard's doing, not a broken route)."""

from __future__ import annotations

import dataclasses
import os

import httpx
import pytest

from repro.proxy.auth import CONTROL_TOKEN_ENV, capability
from tests.support import RunningProxy, repro_cli


def _state(proxy: RunningProxy) -> dict:
    """Every rollout record (status, reward...) and every call (seq, policy version) the store holds."""
    store = proxy.store()
    return {r.rollout_id: (dataclasses.asdict(r), [(c.seq, c.policy_version) for c in store.calls(r.rollout_id)])
            for r in store.list_rollouts()}


def _chat(url: str, **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                      headers=headers, timeout=10)


def test_an_agent_with_its_base_url_cannot_reach_the_control_plane_or_another_rollout(proxy: RunningProxy) -> None:
    mine, theirs = proxy.new_rollout("r1"), proxy.new_rollout("r2")
    proxy.client.set_policy_version(3)
    assert _chat(mine).status_code == 200  # the agent's own model call works
    before = _state(proxy)
    root = proxy.url
    cap = mine.removesuffix("/v1").rsplit("/", 1)[1]
    as_agent = [{}, {"Authorization": "Bearer sk-repro-dummy"}, {"Authorization": f"Bearer {cap}"},
                {"x-api-key": "sk-repro-dummy"}]
    attempts = [
        ("POST", f"{root}/rollouts/r1/finish", {"status": "finished", "reward": 1.0}),
        ("POST", f"{mine.removesuffix('/v1')}/finish", {"status": "finished", "reward": 1.0}),
        ("GET", f"{root}/rollouts/r2", None),
        ("GET", f"{root}/rollouts/r1", None),
        ("POST", f"{root}/policy_version", {"version": 99}),
        ("POST", f"{root}/rollouts", {"rollout_id": "mine"}),
    ]
    for headers in as_agent:
        for method, url, body in attempts:
            resp = httpx.request(method, url, json=body, headers=headers, timeout=10)
            assert resp.status_code in (401, 403, 404), (method, url, headers, resp.status_code)
        for url in (f"{root}/rollouts/r2/v1", f"{root}/rollouts/r2/{cap}/v1", theirs.replace("/r2/", "/r1/"),
                    f"{root}/rollouts/mine/{cap}/v1", mine.replace(cap, cap[:-1] + ("A" if cap[-1] != "A" else "B"))):
            resp = _chat(url, **headers)
            assert resp.status_code in (401, 403, 404), (url, resp.status_code)
    refused = httpx.post(f"{root}/rollouts/r1/finish", json={"reward": 1.0}, timeout=10)
    assert refused.status_code == 401 and "control token" in refused.json()["error"]["message"]
    assert _state(proxy) == before  # nothing was written: no reward, no version, no call, no rollout
    # the control: the job's token opens the same routes
    assert proxy.client.finish("r1", status="finished", reward=1.0)["reward"] == 1.0
    proxy.client.set_policy_version(99)
    assert _chat(theirs).status_code == 200
    assert proxy.store().calls("r2")[-1].policy_version == 99
    assert proxy.client.info("r2")["calls"] == 1


def test_a_capability_is_the_rollouts_own_and_unguessable_without_the_token() -> None:
    assert capability("token-a", "r1") != capability("token-a", "r2")
    assert capability("token-a", "r1") != capability("token-b", "r1")
    assert len(capability("t", "r1")) == 43 and "/" not in capability("t", "r1")


def test_the_proxy_cli_refuses_to_start_without_a_control_token(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k != CONTROL_TOKEN_ENV}
    out = repro_cli("proxy", "--port", "0", "--store", str(tmp_path / "t.sqlite"), env=env, timeout=60)
    assert out.returncode != 0 and CONTROL_TOKEN_ENV in out.stderr
    assert not (tmp_path / "t.sqlite").exists()


@pytest.mark.parametrize("route", ["/rollouts/r1/finish", "/policy_version"])
def test_a_wrong_control_token_is_refused(proxy: RunningProxy, route: str) -> None:
    proxy.new_rollout("r1")
    resp = httpx.post(f"{proxy.url}{route}", json={"version": 1, "reward": 1.0},
                      headers={"Authorization": "Bearer " + "x" * 43}, timeout=10)
    assert resp.status_code == 401

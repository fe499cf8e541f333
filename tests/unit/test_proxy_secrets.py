"""Credentials never reach the store or the logs: nested in a request body, or the proxy's own upstream key."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from repro.common.net import free_port
from repro.common.secrets import is_secret_key, without_secrets
from repro.proxy.config import UPSTREAM_API_KEY_ENV
from repro.serving.commands import start_cpu_server_process, stop_process
from repro.serving.cpu_server_args import CpuServerArgs
from tests.support import RunningProxy, start_proxy

pytestmark = pytest.mark.timeout(300)

_SECRET_KEYS = st.sampled_from(["api_key", "API-Key", "apiKey", "authorization", "Authorization", "x-api-key",
                                "password", "client_secret", "access_token", "openai_api_key", "cookie"])
_HEADER_MAPS = st.sampled_from(["headers", "extra_headers", "default_headers", "Extra-Headers"])
_PLAIN_KEYS = st.sampled_from(["user", "tags", "note", "trace", "items", "max_tokens", "session", "k"])


def _nested(secret: str, canary: str) -> st.SearchStrategy:
    """JSON values where ``secret`` sits only under credential keys or inside header maps, at any depth, and
    ``canary`` (a value that must be stored) sits under plain keys."""
    leaf = st.one_of(st.integers(), st.booleans(), st.none(), st.just(canary))

    def grow(children: st.SearchStrategy) -> st.SearchStrategy:
        plain = st.dictionaries(_PLAIN_KEYS, children, max_size=3)
        with_secret = st.builds(lambda d, k: {**d, k: secret}, plain, _SECRET_KEYS)
        with_headers = st.builds(lambda d, k: {**d, k: {"Authorization": f"Bearer {secret}"}}, plain, _HEADER_MAPS)
        return st.one_of(st.lists(children, max_size=3), plain, with_secret, with_headers)

    return st.recursive(leaf, grow, max_leaves=12)


def test_secret_key_rule() -> None:
    assert all(is_secret_key(k) for k in ("api_key", "Api-Key", "X-API-KEY", "openai_api_key", "Cookie", "headers"))
    assert not any(is_secret_key(k) for k in ("max_tokens", "messages", "prompt_cache_key", "tool_choice"))
    tool = {"type": "object", "properties": {"token": {"type": "string"}, "password": "sk-x"}}
    assert without_secrets(tool) == {"type": "object", "properties": {"token": {"type": "string"}}}


def test_nested_secrets_are_never_stored_or_logged(tmp_path: Path, fake_upstream, caplog, capfd) -> None:
    caplog.set_level(logging.DEBUG)
    server, config = start_proxy(tmp_path, fake_upstream[1])
    sent: list[tuple[str, str]] = []
    with server:
        running = RunningProxy(server.url, config)
        base = running.new_rollout("nest")

        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
        @given(data=st.data())
        def post_one(data: st.DataObject) -> None:
            secret, canary = f"sk-{uuid.uuid4().hex}", f"canary-{uuid.uuid4().hex}"
            metadata = data.draw(_nested(secret, canary))
            message = {"role": "user", "content": canary, "metadata": metadata}
            body = {"model": "m", "messages": [message], "metadata": {"deep": [metadata]}, "user": canary}
            resp = httpx.post(f"{base}/chat/completions", json=body, timeout=10)
            assert resp.status_code == 200, resp.text
            sent.append((secret, canary))

        post_one()
        stored = b"".join(Path(config.store_path + s).read_bytes() for s in ("", "-wal")
                          if Path(config.store_path + s).exists())
    logs = caplog.text + "".join(capfd.readouterr())
    assert len(sent) >= 20 and len(running.store().calls("nest")) == len(sent)
    for secret, canary in sent:
        assert canary.encode() in stored  # the request itself was stored ...
        assert secret.encode() not in stored and secret not in logs  # ... without its credentials


@pytest.fixture(scope="module")
def keyed_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    key = f"sk-server-{uuid.uuid4().hex}"
    port = free_port()
    log_path = tmp_path_factory.mktemp("keyed") / "server.log"
    args = CpuServerArgs(tiny_model_dir, port=port, served_model_name="tiny", max_batch_size=2, api_key=key)
    proc = start_cpu_server_process(args, log_path=log_path)
    try:
        yield f"http://127.0.0.1:{port}", key, log_path
    finally:
        stop_process(proc)


def test_upstream_that_needs_a_key(tmp_path: Path, keyed_server, monkeypatch, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    url, key, server_log = keyed_server
    assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 401  # the server really requires it
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    server, config = start_proxy(tmp_path / "nokey", url)
    with server:
        running = RunningProxy(server.url, config)
        resp = httpx.post(f"{running.new_rollout('nokey')}/chat/completions", json=body, timeout=60)
        assert resp.status_code == 502 and "REPRO_UPSTREAM_API_KEY" in resp.json()["error"]["message"]
        (call,) = running.store().calls("nokey")
        assert call.status == "error" and "no key was sent" in call.error

    monkeypatch.setenv(UPSTREAM_API_KEY_ENV, key)  # the usual way: from the environment, not the config
    server, config = start_proxy(tmp_path / "key", url)
    assert key not in repr(config)
    with server:
        running = RunningProxy(server.url, config)
        resp = httpx.post(f"{running.new_rollout('withkey')}/chat/completions", json=body, timeout=60)
        assert resp.status_code == 200, resp.text
        (call,) = running.store().calls("withkey")
        assert call.status in ("ok", "truncated") and call.completion_ids and call.logprobs
        stored = b"".join(Path(config.store_path + s).read_bytes() for s in ("", "-wal")
                          if Path(config.store_path + s).exists())
    assert key.encode() not in stored and key not in caplog.text
    assert key not in server_log.read_text()


def test_a_run_directory_never_holds_the_upstream_key(tmp_path: Path, monkeypatch) -> None:
    from repro.cli.runner import compose_config, record_config

    monkeypatch.setenv("MY_KEY", "sk-from-env-123")
    overrides = ["experiment=smoke", "proxy.upstream_api_key=${oc.env:MY_KEY}"]
    cfg = compose_config(overrides)
    assert cfg.proxy.upstream_api_key == "sk-from-env-123"  # the job still gets it
    record_config(cfg, tmp_path, [*overrides, "+proxy.extra.api_key=sk-cli-456"])
    written = (tmp_path / "config.yaml").read_text() + (tmp_path / "overrides.txt").read_text()
    assert "sk-from-env-123" not in written and "sk-cli-456" not in written
    assert "upstream_api_key: <redacted>" in written and "+proxy.extra.api_key=<redacted>" in written

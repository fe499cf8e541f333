"""vLLM's in-place reload as :mod:`repro.serving.vllm_weights` drives it, against a scripted HTTP transport (the real
vLLM: tests/integration/test_vllm_cpu.py): the calls it makes and in what order, the folder it names, a missing
checkpoint refused before anything is sent, a refused reload reported with the server's state and always resumed;
and the weight probe's verdicts (:mod:`repro.serving.weight_probe`)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from repro.serving import vllm_weights
from repro.serving.vllm_weights import WeightSyncError, reload_weights
from repro.serving.weight_probe import ReloadCheck, Sampled, StaleWeightsError, check_reload, require_fresh

REAL_SUPPORTS_PATH = vllm_weights.reload_supports_weights_path


class ScriptedVllm:
    """Records each request; ``/collective_rpc`` answers ``rpc_status``, ``/health`` ``healthy``."""

    def __init__(self, rpc_status: int = 200, healthy: bool = True) -> None:
        self.calls: list[tuple[str, dict | None, dict]] = []
        self.rpc_status, self.healthy = rpc_status, healthy

    def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.calls.append((request.url.path, body, dict(request.url.params)))
        if request.url.path == "/collective_rpc":
            return httpx.Response(self.rpc_status, json={"results": [None]})
        if request.url.path == "/health":
            return httpx.Response(200 if self.healthy else 503)
        return httpx.Response(200, json={})

    def client(self) -> httpx.Client:
        return httpx.Client(base_url="http://vllm", transport=httpx.MockTransport(self.handler))

    def paths(self) -> list[str]:
        return [path for path, _, _ in self.calls]


def checkpoint(folder: Path, payload: bytes = b"weights") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(payload)
    return folder


@pytest.fixture(autouse=True)
def takes_weights_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_weights, "reload_supports_weights_path", lambda python="": True)


def test_a_reload_pauses_until_calls_finish_names_the_checkpoint_resets_the_cache_and_resumes(tmp_path: Path) -> None:
    server = ScriptedVllm()
    new = checkpoint(tmp_path / "step-1")
    result = reload_weights("http://vllm", new, checkpoint(tmp_path / "served"), client=server.client())
    assert server.paths() == ["/pause", "/collective_rpc", "/reset_prefix_cache", "/resume"]
    assert server.calls[0][2] == {"mode": "wait"}  # never vLLM's default (abort): calls in flight finish
    assert server.calls[1][1]["kwargs"] == {"weights_path": str(new.resolve())}
    assert result.route.startswith("collective_rpc reload_weights(weights_path=<checkpoint>)")


def test_the_overwrite_route_still_names_the_served_folder(tmp_path: Path) -> None:
    """After a path reload a path-less ``reload_weights`` would reload that path again (vLLM keeps it): the
    overwrite route names the served folder explicitly, so it reads the files just copied there."""
    server, served = ScriptedVllm(), checkpoint(tmp_path / "served", b"old")
    reload_weights("http://vllm", checkpoint(tmp_path / "step-2", b"new"), served, with_path=False,
                   client=server.client())
    assert (served / "model.safetensors").read_bytes() == b"new"
    assert server.calls[1][1]["kwargs"] == {"weights_path": str(served)}


def test_only_a_vllm_without_the_argument_gets_a_pathless_reload(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_weights, "reload_supports_weights_path", lambda python="": False)
    server, served = ScriptedVllm(), checkpoint(tmp_path / "served", b"old")
    reload_weights("http://vllm", checkpoint(tmp_path / "step-1", b"new"), served, client=server.client())
    assert "kwargs" not in server.calls[1][1] and (served / "model.safetensors").read_bytes() == b"new"


@pytest.mark.parametrize("make", [lambda p: p / "absent", lambda p: (p / "empty").mkdir() or p / "empty"])
def test_a_missing_or_empty_checkpoint_is_refused_before_anything_is_sent(tmp_path: Path, make) -> None:
    server = ScriptedVllm()
    with pytest.raises(WeightSyncError, match=r"not sent|does not exist"):
        reload_weights("http://vllm", make(tmp_path), checkpoint(tmp_path / "served"), client=server.client())
    assert server.calls == []


@pytest.mark.parametrize("healthy, state", [(True, "still answers"), (False, "no longer answers")])
def test_a_refused_reload_says_whether_the_server_lives_and_resumes_it(tmp_path: Path, healthy: bool,
                                                                       state: str) -> None:
    server = ScriptedVllm(rpc_status=500, healthy=healthy)
    with pytest.raises(WeightSyncError, match=state):
        reload_weights("http://vllm", checkpoint(tmp_path / "step-1"), checkpoint(tmp_path / "served"),
                       client=server.client())
    assert server.paths()[-1] == "/resume" and "/reset_prefix_cache" not in server.paths()


def _scorer(table: dict[tuple[int, ...], list[float]]):
    return lambda prompt, ids: table[tuple(ids)]


def test_the_probe_fails_stale_weights_and_says_so() -> None:
    before = Sampled([5, 6], [-1.0, -2.0])  # served before the sync
    new = {(5, 6): [-0.5, -1.5]}  # the trainer's new weights moved them by 0.5
    check = check_reload([1, 2], before, Sampled([5, 6], [-1.0, -2.0]), _scorer(new), 2e-3)
    assert not check.passed and check.distinguishable and check.moved == pytest.approx(0.5)
    with pytest.raises(StaleWeightsError, match="old weights are still served"):
        require_fresh(check, "vllm")


def test_the_probe_passes_the_new_weights_and_flags_an_update_too_small_to_tell() -> None:
    before = Sampled([5, 6], [-1.0, -2.0])
    fresh = check_reload([1, 2], before, Sampled([7], [-0.3]), _scorer({(5, 6): [-0.5, -1.5], (7,): [-0.3001]}),
                         2e-3)
    assert fresh.passed and fresh.distinguishable
    require_fresh(fresh, "vllm")
    tiny = check_reload([1, 2], before, Sampled([5, 6], [-1.0, -2.0]), _scorer({(5, 6): [-1.001, -2.0]}), 2e-3)
    assert tiny == ReloadCheck(2, pytest.approx(0.001), pytest.approx(0.001), 2e-3, False, True)


def test_a_server_without_development_routes_is_named(tmp_path: Path) -> None:
    server = ScriptedVllm(rpc_status=404)
    with pytest.raises(WeightSyncError, match="VLLM_SERVER_DEV_MODE"):
        reload_weights("http://vllm", checkpoint(tmp_path / "step-1"), checkpoint(tmp_path / "served"),
                       client=server.client())
    assert server.paths()[-1] == "/resume"


@pytest.mark.parametrize("header, expected", [("self, weights_iterator=None, weights_path=None", True),
                                              ("self, weights_iterator=None", False)])
def test_whether_reload_takes_a_path_is_read_from_vllms_source_without_importing_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, header: str, expected: bool) -> None:
    runner = tmp_path / "vllm" / "v1" / "worker" / "gpu_model_runner.py"
    runner.parent.mkdir(parents=True)
    (tmp_path / "vllm" / "__init__.py").write_text("raise ImportError('importing vLLM costs seconds')\n")
    runner.write_text(f"class GPUModelRunner:\n    def reload_weights({header}) -> None:\n        pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert REAL_SUPPORTS_PATH.__wrapped__("") is expected

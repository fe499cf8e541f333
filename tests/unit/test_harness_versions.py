"""Harness versions are checked before anything is installed: exact, supported by the registry, published."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness_adapters import versions
from harness_adapters.registry import HARNESSES, get_harness, harness_config
from harness_adapters.versions import HarnessVersionError, PackageRef, check_version, nearest

MINI = HARNESSES["mini-swe-agent"]
PUBLISHED = frozenset({"1.17.4", "1.17.5", "2.4.4", "2.4.5", "2.4.6", "2.5.0", "not-a-version"})


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[PackageRef]:
    """A fake index holding PUBLISHED; records which packages were asked for. Empty cache: nothing installed."""
    asked: list[PackageRef] = []

    def release_versions(package: PackageRef) -> frozenset[str]:
        asked.append(package)
        return PUBLISHED

    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(versions, "release_versions", release_versions)
    return asked


def test_a_version_that_was_never_published_is_named_with_its_neighbours(index: list[PackageRef]) -> None:
    with pytest.raises(HarnessVersionError) as info:
        check_version("mini-swe-agent", "2.4.99", MINI.package, MINI.tested)
    message = str(info.value)
    assert "mini-swe-agent 2.4.99 does not exist" in message and "PyPI package mini-swe-agent" in message
    assert message.endswith("nearest releases: 1.17.5, 2.4.4, 2.4.5, 2.4.6, 2.5.0")
    assert index == [PackageRef("pypi", "mini-swe-agent")]
    check_version("mini-swe-agent", "2.4.6", MINI.package, MINI.tested)  # published: passes


def test_a_major_version_without_an_adapter_is_refused_without_asking_the_index(index: list[PackageRef]) -> None:
    with pytest.raises(HarnessVersionError, match=r"refuses mini-swe-agent 3\.0\.0: it has adapters for "
                                                   r"1\.x \(tested: 1\.17\.5\), 2\.x \(tested: 2\.4\.6\) only"):
        check_version("mini-swe-agent", "3.0.0", MINI.package, MINI.tested)
    assert index == []


@pytest.mark.parametrize("version", ["2.x", "latest", ">=2.4", "2", ""])
def test_ranges_and_tags_are_not_exact_releases(index: list[PackageRef], version: str) -> None:
    with pytest.raises(HarnessVersionError, match="is not an exact release"):
        check_version("mini-swe-agent", version, MINI.package, MINI.tested)


def test_an_installed_env_needs_no_index_and_an_unreachable_index_is_not_fatal(
        index: list[PackageRef], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    marker = tmp_path / "cache" / "harness-envs" / "mini-swe-agent-2.4.99" / ".repro-env.json"
    marker.parent.mkdir(parents=True)
    marker.write_text(json.dumps({"sha256": "x"}))
    check_version("mini-swe-agent", "2.4.99", MINI.package, MINI.tested)  # built before: trusted
    assert index == []
    monkeypatch.setattr(versions, "release_versions", lambda package: None)
    check_version("mini-swe-agent", "2.4.98", MINI.package, MINI.tested)  # offline: the install will tell


def test_get_harness_checks_before_building_anything(index: list[PackageRef], tmp_path: Path) -> None:
    with pytest.raises(HarnessVersionError, match=r"mini-swe-agent 2\.4\.99 does not exist"):
        get_harness("mini-swe-agent", {"version": "2.4.99"})
    with pytest.raises(HarnessVersionError, match=r"refuses mini-swe-agent 9\.1\.0"):
        get_harness(None, harness_config("mini-swe-agent", {"version": "9.1.0"}))  # name from the config
    assert not (tmp_path / "cache" / "harness-envs").exists()


def test_nearest_sorts_by_version_not_text() -> None:
    releases = frozenset({"1.9.0", "1.10.0", "1.11.0", "1.2.0", "junk"})
    assert nearest("1.10.5", releases, n=3) == ["1.9.0", "1.10.0", "1.11.0"]
    assert nearest("nonsense", releases, n=2) == ["1.10.0", "1.11.0"]


@pytest.mark.parametrize(("package", "url"), [
    (PackageRef("pypi", "mini-swe-agent"), "https://pypi.org/simple/mini-swe-agent/"),
    (PackageRef("npm", "opencode-ai"), "https://registry.npmjs.org/opencode-ai"),
])
def test_index_urls(monkeypatch: pytest.MonkeyPatch, package: PackageRef, url: str) -> None:
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    monkeypatch.delenv("NPM_CONFIG_REGISTRY", raising=False)
    assert versions._index_request(package)[0] == url

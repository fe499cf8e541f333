"""Is a requested harness version one we can run? Checked before anything is installed.

A version must be an exact release (a frozen run pins what ran), of a major version the registry has an adapter
for, and exist on the package's index (PyPI or npm, asked once per process). An env already built for that
version needs no index; an index that cannot be reached is not an error here (the install then says why)."""

from __future__ import annotations

import functools
import logging
import os
import re
from dataclasses import dataclass
from typing import Literal

import httpx
from packaging.version import InvalidVersion, Version

from repro.common.venvs import env_root, read_marker

log = logging.getLogger(__name__)

EXACT_RELEASE = re.compile(r"^\d+(\.\d+){1,3}([.-]?(a|b|rc|alpha|beta|dev|post)[.-]?\d*)*$")
INDEX_TIMEOUT_S = 10.0
NEAREST = 5


class HarnessVersionError(ValueError):
    """A harness version that is not an exact release, not supported by the registry, or not on its index."""


@dataclass(frozen=True)
class PackageRef:
    """The package a harness version pins: ``index`` is ``pypi`` or ``npm``."""

    index: Literal["pypi", "npm"]
    name: str

    def __str__(self) -> str:
        return f"{'PyPI' if self.index == 'pypi' else 'npm'} package {self.name}"


def check_version(harness: str, version: str, package: PackageRef, tested: dict[str, str]) -> None:
    """Raise HarnessVersionError naming ``version`` unless the registry can run ``harness`` at it."""
    supported = ", ".join(f"{major}.x (tested: {release})" for major, release in sorted(tested.items()))
    if not EXACT_RELEASE.match(version.strip()):
        raise HarnessVersionError(f"{harness} version {version!r} is not an exact release; harness versions are "
                                  f"pinned for frozen runs. Supported: {supported}")
    major = version.strip().split(".", 1)[0]
    if major not in tested:
        raise HarnessVersionError(f"the harness registry refuses {harness} {version}: it has adapters for "
                                  f"{supported} only (harness_adapters/registry.py)")
    if read_marker(env_root(harness, version)) is not None:
        return
    releases = release_versions(package)
    if releases is not None and version not in releases:
        raise HarnessVersionError(f"{harness} {version} does not exist: the {package} has no release {version!r}; "
                                  f"nearest releases: {', '.join(nearest(version, releases)) or 'none'}")


def nearest(version: str, releases: frozenset[str], n: int = NEAREST) -> list[str]:
    """Up to ``n`` releases around where ``version`` would sort (newest last)."""
    ordered = sorted((v for v in releases if _parses(v)), key=Version)
    if not _parses(version):
        return ordered[-n:]
    at = sum(1 for v in ordered if Version(v) < Version(version))
    start = max(0, min(at - n // 2, len(ordered) - n))
    return ordered[start:start + n]


@functools.lru_cache(maxsize=32)
def release_versions(package: PackageRef) -> frozenset[str] | None:
    """Every published version of ``package``, or None when its index cannot be reached."""
    url, headers = _index_request(package)
    try:
        resp = httpx.get(url, headers=headers, timeout=INDEX_TIMEOUT_S, follow_redirects=True)
    except httpx.HTTPError as exc:
        log.warning("could not reach the index for %s (%s); the install will say whether the version exists",
                    package, exc)
        return None
    if resp.status_code == 404:
        return frozenset()
    if resp.status_code != 200:
        log.warning("index for %s answered %s; not checking the version", package, resp.status_code)
        return None
    data = resp.json()
    versions = data.get("versions", [])
    return frozenset(versions if isinstance(versions, list) else versions.keys())


def _index_request(package: PackageRef) -> tuple[str, dict[str, str]]:
    if package.index == "npm":
        registry = os.environ.get("NPM_CONFIG_REGISTRY") or "https://registry.npmjs.org/"
        return f"{registry.rstrip('/')}/{package.name}", {"Accept": "application/vnd.npm.install-v1+json"}
    simple = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple/"
    return f"{simple.rstrip('/')}/{package.name}/", {"Accept": "application/vnd.pypi.simple.v1+json"}


def _parses(version: str) -> bool:
    try:
        Version(version)
    except InvalidVersion:
        return False
    return True

"""Every harness class the registry can hand out (and the rebuilt loop, and the unit tests' fake) has each member of
the ``Harness`` protocol, with the protocol's parameters."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import pytest

from harness_adapters.registry import HARNESSES, harness_class
from repro.protocols import Harness, HarnessBase, HarnessLimits, RemoteHarness, StreamingHarness
from repro.rl.rebuilt.harness import RebuiltMiniSweAgentHarness
from repro.testing import FakeHarness, FakeStreamingHarness


def protocol_members(protocol: type) -> tuple[set[str], dict[str, list[str]]]:
    """The protocol's attributes (its annotations and properties) and its methods with their parameter names
    (``self`` left out)."""
    methods = {name: list(inspect.signature(value).parameters)[1:] for name, value in vars(protocol).items()
               if inspect.isfunction(value) and value.__qualname__.startswith(f"{protocol.__name__}.")}
    properties = {name for name, value in vars(protocol).items() if isinstance(value, property)}
    return set(protocol.__annotations__) | properties, methods


def missing_members(cls: type, protocol: type = Harness) -> list[str]:
    """The protocol members ``cls`` lacks: an attribute neither set nor annotated on the class (an instance
    attribute must be annotated), or a method that is absent or takes other parameters."""
    attributes, methods = protocol_members(protocol)
    missing = [name for name in sorted(attributes)
               if not any(name in vars(k) or name in getattr(k, "__annotations__", {}) for k in cls.__mro__)]
    for name, params in sorted(methods.items()):
        method = getattr(cls, name, None)
        if not callable(method) or list(inspect.signature(method).parameters)[1:] != params:
            missing.append(f"{name}{tuple(params)}")
    return missing


def harness_classes() -> dict[str, type]:
    """Every implementation in the registry (the per-major-version ones too), the rebuilt loop and the fake."""
    classes = {f"{name}@{major or 'default'}": harness_class(name, f"{major}.0" if major else None)
               for name, entry in HARNESSES.items() for major in ("", *entry.by_major)}
    return classes | {"rebuilt": RebuiltMiniSweAgentHarness, "fake": FakeHarness}


def test_the_protocol_names_what_callers_use() -> None:
    attributes, methods = protocol_members(Harness)
    assert attributes == {"name", "version", "loop_kind", "limits"}
    assert methods == {"identity": [], "run": ["rollouts", "concurrency"], "close": [], "__enter__": [],
                       "__exit__": ["exc"]}


@pytest.mark.parametrize(("label", "cls"), sorted(harness_classes().items()))
def test_each_harness_class_has_every_protocol_member(label: str, cls: type) -> None:
    assert missing_members(cls) == [], label


def test_a_class_without_close_or_limits_is_caught() -> None:
    class Partial:
        name, version = "p", "1"

        def identity(self) -> dict[str, Any]:
            return {}

        def run(self, rollouts: list, concurrency: int) -> list:
            return []

    assert missing_members(Partial) == ["limits", "loop_kind", "__enter__()", "__exit__('exc',)", "close()"]


def test_the_fake_is_a_working_harness() -> None:
    with FakeHarness(cfg=SimpleNamespace(step_limit=3)) as harness:
        assert harness.run([], concurrency=1) == [] and harness.identity()["name"] == "fake"
        assert harness.limits == HarnessLimits(3, 0.0)
    assert harness.closed


def test_the_runner_dispatches_on_the_protocol_a_harness_implements() -> None:
    """What ``RolloutRunner`` checks (no ``hasattr``): a streaming harness streams, a remote one runs whole samples
    on its hosts, anything else with ``run`` is batched; a harness of one's own needs only ``run`` (HarnessBase)."""
    class Mine(HarnessBase):
        def run(self, rollouts: list, concurrency: int) -> list:
            return []

    class Hosts(HarnessBase):
        def base_url(self, client: Any, rollout_id: str) -> str:
            return ""

        def run_samples(self, jobs: list, concurrency: int) -> list:
            return []

    assert isinstance(FakeStreamingHarness(), StreamingHarness) and isinstance(FakeStreamingHarness(), Harness)
    assert isinstance(Mine(), Harness) and not isinstance(Mine(), StreamingHarness | RemoteHarness)
    assert isinstance(Hosts(), RemoteHarness) and not isinstance(Hosts(), StreamingHarness)
    assert not isinstance(object(), Harness)

"""Recording, OpenAI-compatible proxy between an unchanged harness and a model server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from repro.proxy.config import ProxyConfig
from repro.proxy.routes import purpose_base_url

if TYPE_CHECKING:
    from repro.proxy.app import ProxyApp

__all__ = ["ProxyApp", "ProxyConfig", "purpose_base_url"]


def __getattr__(name: str) -> Any:
    """``ProxyApp`` on first use: the app imports the trace store (and numpy), which ``repro proxy --help`` and the
    jobs that only need ``ProxyConfig`` do not."""
    if name == "ProxyApp":
        from repro.proxy.app import ProxyApp

        return ProxyApp
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

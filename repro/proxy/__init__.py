"""Recording, OpenAI-compatible proxy between an unchanged harness and a model server."""

from repro.proxy.app import ProxyApp
from repro.proxy.config import ProxyConfig

__all__ = ["ProxyApp", "ProxyConfig"]

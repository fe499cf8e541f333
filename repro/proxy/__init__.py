"""Recording, OpenAI-compatible proxy between an unchanged harness and a model server."""

from repro.proxy.app import ProxyApp
from repro.proxy.config import ProxyConfig
from repro.proxy.routes import purpose_base_url

__all__ = ["ProxyApp", "ProxyConfig", "purpose_base_url"]

"""Who may do what at the proxy: the control plane and each rollout's own model routes, apart.

* **Control routes** (register, finish and read rollouts, set the policy version) need the proxy's control token,
  ``Authorization: Bearer <token>``: generated per proxy start by the job that starts it (or taken from
  ``REPRO_PROXY_CONTROL_TOKEN``), handed to the proxy in its environment, never stored, logged, put on a command line
  or given to an agent.
* **A rollout's model routes** carry the rollout's capability in the path, ``/rollouts/<id>/<capability>/v1/...``:
  an HMAC of the rollout id under the control token, so it is unguessable without the token, and one rollout's base
  URL (all its agent is given) opens no other rollout's routes. Harnesses pass base URLs through unchanged.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from repro.proxy.errors import ProxyError

CONTROL_TOKEN_ENV = "REPRO_PROXY_CONTROL_TOKEN"


def new_control_token() -> str:
    """A fresh control token (256 random bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def capability(token: str, rollout_id: str) -> str:
    """The path segment that opens ``rollout_id``'s model routes (43 URL-safe characters)."""
    digest = hmac.new(token.encode(), b"rollout:" + rollout_id.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def control_header(token: str) -> dict[str, str]:
    """The header a control call carries."""
    return {"Authorization": f"Bearer {token}"}


def require_control(headers: dict[bytes, bytes], token: str) -> None:
    """401 unless the request carries the control token."""
    given = headers.get(b"authorization", b"").decode("latin-1")
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        raise ProxyError(401, "this route is the proxy's control plane: it needs the control token (Authorization: "
                              f"Bearer ${CONTROL_TOKEN_ENV}), which the job holds and an agent is never given",
                         kind="authentication_error")


def require_capability(token: str, rollout_id: str, given: str) -> None:
    """403 unless ``given`` is ``rollout_id``'s capability."""
    if not hmac.compare_digest(given.encode(), capability(token, rollout_id).encode()):
        raise ProxyError(403, f"this URL does not open rollout {rollout_id!r}: a rollout's model calls go to the base "
                              "URL its registration returned (/rollouts/<id>/<capability>/v1)",
                         kind="permission_error")

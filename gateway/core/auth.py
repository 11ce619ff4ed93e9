"""API keys on the wire, both directions: the header the gateway sends, and the check of what it is sent.

One check for every server the gateway runs (``serve``'s routes and ``worker``'s inventory), so a key
that opens one opens the other in the same two forms: ``Authorization: Bearer KEY`` or ``x-api-key``.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence


def bearer_header(api_key: str | None) -> dict[str, str]:
    """The header that presents ``api_key`` to an OpenAI-compatible server (none without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def matching_key(authorization: str | None, x_api_key: str | None, keys: Sequence[str]) -> str | None:
    """The configured key the request authenticated with, or None: who a request is comes from this key
    alone, never from what else its headers carry. Either header may carry the key (SDKs send both, one
    of them a placeholder); every offered value is compared with every key in constant time, Bearer's
    value first where both are valid keys. No keys matches nothing: the caller decides whether a server
    without keys is open. Header values arrive as bytes decoded Latin-1 (ASGI, Starlette), so a key is
    compared as the UTF-8 bytes a client sends for it."""
    offered: list[str] = []
    if (authorization or "").lower().startswith("bearer "):
        offered.append((authorization or "")[7:].strip())
    offered.append(x_api_key or "")
    sent = [value.encode("latin-1", "replace") for value in offered if value]
    matched = [key for value in sent for key in keys if key and hmac.compare_digest(value, key.encode("utf-8"))]
    return matched[0] if matched else None

"""One TLS context for the gateway's HTTP clients (engines, other nodes, the gateway asked by ``agent``).

httpx builds a context for each client it makes, loading every CA certificate again (~50 ms of CPU);
the clients here are short-lived (a health poll, one question), so they share this one."""

from __future__ import annotations

import ssl
from functools import cache

import httpx


@cache
def client_tls() -> ssl.SSLContext:
    """httpx's own default context (certifi's CAs, certificates verified), made once per process; the
    clients ignore the environment's proxy and CA variables (``trust_env=False``), and so does it."""
    return httpx.create_ssl_context(trust_env=False)

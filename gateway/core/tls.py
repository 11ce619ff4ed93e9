"""The gateway's HTTP clients (engines, other nodes, the gateway asked by ``agent``), made in one place.

Every client ignores the environment's proxy and CA variables (``trust_env=False``: an engine on loopback or
a worker on the private network must never be reached through a proxy) and shares one TLS context: httpx
builds a context for each client it makes, loading every CA certificate again (~50 ms of CPU), and the
clients here are short-lived (a health poll, one question)."""

from __future__ import annotations

import ssl
from functools import cache
from typing import Any

import httpx


@cache
def client_tls() -> ssl.SSLContext:
    """httpx's own default context (certifi's CAs, certificates verified), made once per process; the
    clients ignore the environment's proxy and CA variables (``trust_env=False``), and so does it."""
    return httpx.create_ssl_context(trust_env=False)


def http_client(**options: Any) -> httpx.Client:
    """A blocking client with the gateway's settings (``options``: httpx's own, timeout first)."""
    return httpx.Client(trust_env=False, verify=client_tls(), **options)


def async_http_client(**options: Any) -> httpx.AsyncClient:
    """An asyncio client with the gateway's settings (``options``: httpx's own)."""
    return httpx.AsyncClient(trust_env=False, verify=client_tls(), **options)


def http_get(url: str, **options: Any) -> httpx.Response:
    """One GET with the gateway's settings, for a single question (``options``: headers, timeout)."""
    with http_client() as client:
        return client.get(url, **options)

"""Every answer from the hub treated as someone else's input: ``huggingface_hub``'s HTTP client is given
request and response hooks that check what the library would otherwise trust.

- the hub's credentials (``Authorization``) go only to the hub's own origin (``HF_ENDPOINT``, or a
  Hugging Face host: huggingface_hub's rule for redirects), never to a host or port a redirect names;
- names that become paths in the cache are checked where they arrive: a file's ``ETag`` /
  ``X-Linked-Etag`` (the blob's name) must be one plain path component, ``X-Repo-Commit`` (the
  snapshot's directory) a 40-digit commit hash, a declared size a sane integer;
- every body is read under a byte cap and a deadline fitted to what is read: a ``Range`` read gets
  the bytes it asked for (a server that ignores ``Range`` and sends a whole file is cut off there), a
  download the size the hub declared (:func:`budget`), anything else (an API answer, a small file)
  :data:`DEFAULT_BYTES`; the time allowed is :data:`BASE_SECONDS` plus the bytes at :data:`MIN_RATE`.

A refused answer raises :class:`UntrustedAnswer` (a ModelError: the CLI prints one line).
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gateway.core.errors import ModelError

DEFAULT_BYTES = 64 << 20  # an API answer or a small file (config.json, an index): the largest real ones are ~10 MB
BASE_SECONDS = 30.0  # on top of the time the bytes take at MIN_RATE
MIN_RATE = 256 << 10  # bytes per second: a body slower than this on average is cut off
MAX_DECLARED = 1 << 50  # a size above a pebibyte is not a model file's
CONNECT_SECONDS, READ_SECONDS = 10.0, 30.0  # per connection attempt and per read (the library sets its own on some)

SAFE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,255}")  # one path component, never "." or ".."
COMMIT = re.compile(r"[0-9a-f]{40}")
_HUB_ORIGINS = ("https://huggingface.co", "https://hf.co", "https://hub-ci.huggingface.co")


class UntrustedAnswer(ModelError):
    """The hub (or what answered in its place) sent something the gateway will not use."""


@dataclass(frozen=True)
class Budget:
    bytes: int
    what: str = ""


_BUDGET: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("hub_budget", default=None)


@contextlib.contextmanager
def budget(size: int, what: str) -> Iterator[None]:
    """Within the block, a body with no ``Range`` may be as long as ``size`` (a download's declared size)."""
    token = _BUDGET.set(Budget(max(0, size), what))
    try:
        yield
    finally:
        _BUDGET.reset(token)


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) with the scheme's default port, as huggingface_hub compares them."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    return parts.scheme, (parts.hostname or "").lower(), port or {"http": 80, "https": 443}.get(parts.scheme, 0)


def trusted_origins() -> set[tuple[str, str, int]]:
    """Where the hub token may go: the configured endpoint and the Hugging Face hosts."""
    from huggingface_hub import constants

    return {origin(constants.ENDPOINT), *(origin(url) for url in _HUB_ORIGINS)}


def asked_length(range_header: str) -> int | None:
    """The bytes a ``Range: bytes=a-b`` request asks for; None for an open or absent range."""
    match = re.fullmatch(r"\s*bytes=(\d+)-(\d+)\s*", range_header or "")
    return int(match.group(2)) - int(match.group(1)) + 1 if match else None


def _limit(request: Any) -> tuple[int, str]:
    """(bytes allowed in the body, what they are) for one request."""
    asked = asked_length(request.headers.get("range", ""))
    if asked is not None:
        return max(asked, 0), f"the {asked:,} bytes asked for"
    found = _BUDGET.get()
    if found is not None:
        return found.bytes, f"the {found.bytes:,} bytes declared for {found.what}"
    return DEFAULT_BYTES, f"the {DEFAULT_BYTES >> 20} MiB cap on a hub answer"


def _where(url: Any) -> str:
    text = str(url)
    return text if len(text) <= 160 else text[:157] + "..."


def check_names(response: Any, url: Any) -> None:
    """Raise when a file answer carries a name or size the cache would be built from and that is unsafe."""
    if "/resolve/" not in str(url.path):
        return
    headers = response.headers
    for key in ("x-linked-etag", "etag"):
        if (value := headers.get(key)) is not None:
            etag = value.removeprefix("W/").strip('"')
            if not SAFE_NAME.fullmatch(etag):
                raise UntrustedAnswer(f"{_where(url)}: the hub's {key} {value[:80]!r} is not a plain name: refused")
    commit = headers.get("x-repo-commit")
    if commit is not None and not COMMIT.fullmatch(commit):
        raise UntrustedAnswer(f"{_where(url)}: the hub's X-Repo-Commit {commit[:80]!r} is not a commit hash: refused")
    for key in ("x-linked-size", "content-length"):
        if (size := headers.get(key)) is not None and not (size.isdigit() and int(size) <= MAX_DECLARED):
            raise UntrustedAnswer(f"{_where(url)}: the hub's {key} {size[:40]!r} is not a file size: refused")


def _capped(inner: Any, url: Any, limit: int, what: str) -> Any:
    """A response body that stops with UntrustedAnswer past its byte cap or its deadline."""
    import httpx2  # huggingface_hub 2.x's HTTP library

    allowed = BASE_SECONDS + limit / MIN_RATE
    deadline = time.monotonic() + allowed

    class Capped(httpx2.SyncByteStream):
        def __iter__(self) -> Iterator[bytes]:
            seen = 0
            for chunk in inner:
                seen += len(chunk)
                if seen > limit:
                    raise UntrustedAnswer(f"{_where(url)}: the answer runs past {what}: refused")
                if time.monotonic() > deadline:
                    raise UntrustedAnswer(f"{_where(url)}: {seen:,} bytes in more than {allowed:.0f} s: refused")
                yield chunk

        def close(self) -> None:
            inner.close()

    return Capped()


def _strip_foreign_token(request: Any) -> None:
    """Request hook: the hub token leaves only for the hub's own origin (the library's rule, for every request)."""
    if "authorization" in request.headers and origin(str(request.url)) not in trusted_origins():
        del request.headers["authorization"]


def _check_and_cap(response: Any) -> None:
    """Response hook (before any body is read): names checked, the body capped in bytes and time."""
    check_names(response, response.request.url)
    limit, what = _limit(response.request)
    response.stream = _capped(response.stream, response.request.url, limit, what)


def client() -> Any:
    """huggingface_hub's own default client (its proxies and hooks kept), with the guard's hooks and
    default timeouts (the library leaves some requests without one)."""
    import httpx2
    from huggingface_hub.utils._http import default_client_factory

    made = default_client_factory()
    made.timeout = httpx2.Timeout(READ_SECONDS, connect=CONNECT_SECONDS)
    hooks = made.event_hooks
    made.event_hooks = {
        "request": [*hooks["request"], _strip_foreign_token],
        "response": [*hooks["response"], _check_and_cap],
    }
    return made


_INSTALLED = False


def guard_hub() -> None:
    """Make every request huggingface_hub sends from this process go through the guard (installed once)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from huggingface_hub import set_client_factory

    set_client_factory(client)
    _INSTALLED = True

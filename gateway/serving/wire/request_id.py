"""The current request's id: set at the edge, forwarded to the engine as ``X-Request-Id`` by the
transport, and written into JSON log lines. Here, below both, so that neither imports the other."""

from __future__ import annotations

import re
from contextvars import ContextVar

request_id: ContextVar[str | None] = ContextVar("request_id", default=None)

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")


def usable_request_id(offered: str | None) -> str | None:
    """A client's X-Request-Id when it is a plain token (it goes back out and on to the engine as a
    header and into log lines); anything else is replaced by a fresh id rather than mangled."""
    return offered if offered and _REQUEST_ID.fullmatch(offered) else None

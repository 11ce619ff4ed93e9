"""A malicious hub: answers a test (or benchmarks/hardening.py) gives the local hub's paths
(``LocalHub.hostile``). A NAMED stand-in: no real hub misbehaves on demand, and these are what an
adversarial run against the gateway found it trusting (issue 30):

- :func:`renamed_etag`, :func:`renamed`: a file answered as usual but with an ETag such as
  ``"../../outside"`` (the cache names the blob after it) or such an ``X-Repo-Commit`` (its snapshot);
- :func:`moved_to`: a file's resolve URL redirects, as the hub redirects to its CDN, to another origin
  (here another port), which records the headers it was sent;
- :func:`endless_body`: a file whose HEAD declares its size but whose GET never ends;
- :func:`ignores_range`: a file whose GET ignores ``Range`` and sends the file, then zeros without end;
- :func:`endless_json`: an API route (model info, listing) whose JSON never ends;
- :func:`slow_json`: one that never ends slowly (a few bytes at a time, under any read timeout).

"Never ends" is ``limit`` bytes (4 GiB by default): far more than any cap, and still finite should a
client under test read it all. ``Sent`` counts what each answer put on the wire.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.integration.tools.local_hub import LocalHub, free_port
from tests.served_thread import WakeableServer
from tests.waiting import wait_until

CHUNK = 1 << 20
ENDLESS = 4 << 30
Answer = Callable[[Request], Awaitable[Response]]


@dataclass
class Sent:
    """Bytes an answer has put on the wire, and the headers each request to it carried."""

    bytes: int = 0
    headers: list[dict[str, str]] = field(default_factory=list)


def _endless(sent: Sent, first: bytes = b"", filler: bytes = b"\0" * CHUNK, limit: int = ENDLESS) -> Iterator[bytes]:
    if first:
        sent.bytes += len(first)
        yield first
    while sent.bytes < limit:
        sent.bytes += len(filler)
        yield filler


async def _as_usual(hub: LocalHub, request: Request) -> Response:
    """What the local hub answers a resolve request (``/{org}/{name}/resolve/{rev}/{path}``) with."""
    org, name, _, rev, path = request.url.path.strip("/").split("/", 4)
    request.scope["path_params"] = {"org": org, "name": name, "rev": rev, "path": path}
    return await hub.resolve(request)


def renamed(hub: LocalHub, header: str, value: str) -> Answer:
    """A file answered as usual but with ``header`` (``ETag``, ``X-Repo-Commit``) set to ``value``."""

    async def answer(request: Request) -> Response:
        response = await _as_usual(hub, request)
        response.headers[header] = value
        return response

    return answer


def renamed_etag(hub: LocalHub, etag: str) -> Answer:
    return renamed(hub, "etag", f'"{etag}"')


def moved_to(hub: LocalHub, location: str) -> Answer:
    """302 to ``location`` with the file's metadata on the redirect, as the hub answers for an LFS file."""

    async def answer(request: Request) -> Response:
        found = await _as_usual(hub, request)
        headers = {
            "Location": location,
            "X-Linked-Etag": found.headers["etag"],
            "X-Linked-Size": str(int(found.headers["content-length"])),
            "X-Repo-Commit": found.headers["x-repo-commit"],
        }
        return Response(status_code=302, headers=headers)

    return answer


def endless_body(hub: LocalHub, sent: Sent, limit: int = ENDLESS) -> Answer:
    """HEAD as usual (the declared size); GET answered 200 without a length, never ending."""

    async def answer(request: Request) -> Response:
        if request.method == "HEAD":
            return await _as_usual(hub, request)
        return StreamingResponse(_endless(sent, limit=limit), media_type="application/octet-stream")

    return answer


def ignores_range(hub: LocalHub, sent: Sent, limit: int = ENDLESS, status: int = 200) -> Answer:
    """GET answered ``status`` (200, or 206 as if the range were honoured) whatever the Range: the
    file's first bytes, then zeros without end."""

    async def answer(request: Request) -> Response:
        if request.method == "HEAD":
            return await _as_usual(hub, request)
        path = request.url.path.split("/resolve/", 1)[0].strip("/")
        name = request.url.path.split("/", 5)[-1]
        hub_file = hub.repos[path.lower()].files[name]
        first = hub_file.read(0, hub_file.size)
        return StreamingResponse(
            _endless(sent, first, limit=limit), status_code=status, media_type="application/octet-stream"
        )

    return answer


def endless_json(sent: Sent, limit: int = ENDLESS) -> Answer:
    """A JSON answer that opens an array and keeps adding to it."""
    items = b'{"rfilename": "model.safetensors", "size": 1},' * (CHUNK // 48)

    async def answer(_request: Request) -> Response:
        opening = b'{"id": "x/y", "siblings": ['
        return StreamingResponse(_endless(sent, opening, items, limit), media_type="application/json")

    return answer


def slow_json(sent: Sent, every_s: float = 0.2) -> Answer:
    """A JSON answer that trickles: a few bytes every ``every_s`` seconds, for as long as it is read."""

    async def trickle() -> Any:
        yield b'{"id": "x/y", "siblings": ['
        while sent.bytes < ENDLESS:
            await asyncio.sleep(every_s)  # the hostile answer's pace, not a wait
            sent.bytes += 8
            yield b"1,2,3,4,"

    async def answer(_request: Request) -> Response:
        return StreamingResponse(trickle(), media_type="application/json")

    return answer


def recorder(sent: Sent, body: bytes) -> Starlette:
    """Another origin (a CDN, or an attacker's port): serves ``body`` and keeps each request's headers."""

    async def serve(request: Request) -> Response:
        sent.headers.append({k.lower(): v for k, v in request.headers.items()})
        if request.method == "HEAD":
            return Response(headers={"Content-Length": str(len(body))})
        sent.bytes += len(body)
        return Response(body, media_type="application/octet-stream")

    return Starlette(routes=[Route("/{path:path}", serve, methods=["GET", "HEAD"])])


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` on a free loopback port in a thread while the block runs: its URL."""
    port = free_port()
    server = WakeableServer(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(
        lambda: server.started,
        what="the recorder to start",
        timeout_s=10,
        abort=lambda: None if thread.is_alive() else "its thread ended",
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        thread.join(timeout=10)

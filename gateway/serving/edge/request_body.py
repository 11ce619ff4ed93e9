"""Reading a request body into a JSON object, with its cost bounded before any of it is parsed.

A body under ``max_body_bytes`` can still hold two million tiny messages: parsing and validating them
took 18 s of CPU on the event loop and 1.9 GB (every other client waited). Counting its objects and
arrays first is one pass in C over the bytes (70 ms for 64 MB); a body with more than
``max_body_elements`` is refused before ``json.loads`` builds anything. The count includes braces
inside strings, so it is an upper bound: a real request would need megabytes of code in one prompt to
reach the default.

What a body under both caps can still cost is bounded (measured: 33 MB of 99,000 messages parse in
0.09 s and validate in 0.18 s), but several such bodies arriving together would be parsed back to
back with nobody else served in between. A body over ``LARGE_BODY_BYTES`` therefore waits for its turn
(:class:`BodyReader`): one large body is parsed at a time, each after a short pause in which the event
loop serves what is waiting, so ``/health`` and small requests are answered between two of them. (A worker thread would
not help: ``json.loads`` and pydantic-core hold the GIL for the whole call.)

JSON on the wire is UTF-8 (RFC 8259): a body in UTF-16/32 or with a byte-order mark is refused rather
than forwarded for the engine to choke on, and numbers that overflow to infinity (``1e999``) are
refused like the NaN/Infinity literals (the gateway could not write them back as JSON).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request

from gateway.core import exact_json
from gateway.serving.dialects import request_shapes
from gateway.serving.wire.error_shapes import ApiError

LARGE_BODY_BYTES = 1 << 20  # agents' everyday requests stay below; a long conversation or an image does not
# before each large parse: a waiting request needs several turns of the loop (accept, read, answer);
# sleep(0) gave it one, and four 30 MB bodies still held /health for two parses (0.67 s; now 0.32 s)
_PAUSE_S = 0.005


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes (max_body_bytes)")
    parts: list[bytes] = []
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise ApiError(413, f"request body exceeds the limit of {limit} bytes (max_body_bytes)")
        parts.append(part)
    return b"".join(parts)


def parse_object(body: bytes, max_elements: int) -> dict[str, Any]:
    """The body as a JSON object, or a 400/413 that says what is wrong with it."""
    if not body.strip():
        raise ApiError(400, "request body is empty: send a JSON object")
    elements = body.count(b"{") + body.count(b"[")
    if elements > max_elements:
        raise ApiError(
            413,
            f"request body holds about {elements} JSON objects and arrays, more than {max_elements} "
            "(max_body_elements): send fewer messages or content blocks",
            code="request_too_large",
        )
    if body.startswith(b"\xef\xbb\xbf"):
        raise ApiError(
            400, "request body starts with a byte-order mark: send UTF-8 JSON without one", code="invalid_json"
        )
    if b"\x00" in body[:4]:
        raise ApiError(400, "request body looks like UTF-16 or UTF-32: send UTF-8 JSON", code="invalid_json")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(
            400, f"request body is not UTF-8 (byte {exc.start}): send UTF-8 JSON", code="invalid_json"
        ) from None
    try:
        payload = exact_json.loads(text)
    except ValueError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    except RecursionError:
        raise ApiError(400, "request body is nested too deeply", code="invalid_json") from None
    if not isinstance(payload, dict):
        raise ApiError(400, f"request body must be a JSON object, not a JSON {type(payload).__name__}")
    if _SURROGATE_ESCAPE.search(text):
        _refuse_lone_surrogates(payload)
    return payload


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")  # \ud800-\udfff: half of a pair, or alone


def _refuse_lone_surrogates(payload: dict[str, Any]) -> None:
    """A ``\\udXXX`` escape without its other half decodes to a string that is not text: it could not
    be forwarded as UTF-8 nor echoed back (a Responses answer echoes ``instructions`` and ``metadata``),
    and failed there as a 500. Pairs (an emoji escaped by an ASCII-only client) are text and pass."""
    try:
        json.dumps(payload, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(
            400,
            "request body holds a lone UTF-16 surrogate escape (\\ud800-\\udfff without its pair): send text",
            code="invalid_json",
        ) from None


class BodyReader:
    """Reads, parses and checks request bodies within the caps; large ones one at a time (see above)."""

    def __init__(self, max_bytes: int, max_elements: int = 100_000) -> None:
        self.max_bytes, self.max_elements = max_bytes, max_elements
        self._large_turn = asyncio.Lock()  # bound to the serving loop on first use

    async def read(self, request: Request, shape: type[BaseModel]) -> tuple[bytes, dict[str, Any]]:
        """The body's bytes (forwarded as they came when nothing changes) and the object they hold,
        checked against ``shape`` (a 400 naming the first field that does not fit)."""
        body = await read_body(request, self.max_bytes)
        if len(body) < LARGE_BODY_BYTES:
            return body, self._parse(body, shape)
        async with self._large_turn:
            await asyncio.sleep(_PAUSE_S)  # what arrived meanwhile is served first
            return body, self._parse(body, shape)

    def _parse(self, body: bytes, shape: type[BaseModel]) -> dict[str, Any]:
        payload = parse_object(body, self.max_elements)
        request_shapes.check(shape, payload)
        return payload

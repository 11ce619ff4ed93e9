"""Errors as agents read them: one exception, :class:`ApiError`, written in the route's dialect.

OpenAI routes get OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``; ``/v1/messages*``
(Claude Code) gets Anthropic's ``{"type": "error", "error": {"type", "message"}}``. Agents and SDKs
read the message and the status code; ``Retry-After`` tells their retry logic how long to wait.
This module is the one exception → HTTP error mapping: :func:`as_api_error` turns any exception into
an ApiError, :func:`shape_for` picks the dialect by path, and each :class:`ErrorShape` writes it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from gateway.backends.registry import context_overflow

RETRY_AFTER_S = 5

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "server_error",
    503: "service_unavailable",
    504: "server_error",
}


class ApiError(Exception):
    """Raised anywhere in request handling; turned into a response by the app's handler."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, object]:
        """OpenAI's shape (also what a broken passthrough stream's last event carries)."""
        return {
            "error": {
                "message": self.message,
                "type": _TYPES.get(self.status, "invalid_request_error"),
                "param": self.param,
                "code": self.code,
            }
        }

    def headers(self) -> dict[str, str] | None:
        """Retry-After in seconds, and retry-after-ms, which the OpenAI and Anthropic SDKs prefer."""
        if self.retry_after_s is None:
            return None
        return {"Retry-After": str(self.retry_after_s), "retry-after-ms": str(self.retry_after_s * 1000)}

    def sse_event(self) -> bytes:
        """The same error as a final server-sent event, for a stream that cannot continue."""
        return b"data: " + json.dumps(self.body()).encode() + b"\n\n"


def overflow_error(prompt_tokens: int | None, context_length: int) -> ApiError:
    """A prompt longer than the context, in OpenAI's own words: agents and SDKs match
    ``context_length_exceeded`` and "maximum context length" to offer compaction."""
    resulted = f"{prompt_tokens} tokens" if prompt_tokens else "more tokens than that"
    return ApiError(
        400,
        f"This model's maximum context length is {context_length} tokens. However, your messages resulted in "
        f"{resulted}. Please reduce the length of the messages.",
        code="context_length_exceeded",
        param="messages",
    )


def engine_overflow(answer: Any, context_length: int) -> ApiError | None:
    """An engine's refusal of a too-long prompt (any engine's wording, see ``gateway.backends.*.overflow``) as
    the canonical :func:`overflow_error`; None for any other answer."""
    error = answer.get("error") if isinstance(answer, dict) else None
    message = error.get("message") if isinstance(error, dict) else error if isinstance(error, str) else None
    text = message if isinstance(message, str) else answer if isinstance(answer, str) else json.dumps(answer)
    found = context_overflow(text)
    if found is None:
        return None
    return overflow_error(found.prompt_tokens, found.context_length or context_length)


def unavailable(message: str) -> ApiError:
    return ApiError(503, message, code="backend_unavailable", retry_after_s=RETRY_AFTER_S)


def as_api_error(exc: Exception, method: str, path: str) -> ApiError:
    """Any exception a route raised, as the error the client should read (the caller logs the
    unexpected ones: they become a 500 that points at the gateway log)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, HTTPException):
        if exc.status_code == 404:
            message = f"no route {method} {path}: see /v1/models, /v1/chat/completions, /v1/completions"
        elif exc.status_code == 405:
            message = f"method {method} is not allowed on {path}"
        else:
            message = str(exc.detail)
        return ApiError(exc.status_code, message)
    return ApiError(500, f"internal gateway error ({type(exc).__name__}); see the gateway log")


@dataclass(frozen=True)
class ErrorShape:
    """How one dialect writes an error."""

    body: Callable[[ApiError], dict[str, object]]
    bad_key_message: str  # what a request without a valid API key is told
    relays_engine_errors: bool  # the engine's own (OpenAI-shaped) errors are already in this shape
    event_name: bytes | None = None  # streams: the error event's name (Anthropic's), or an unnamed event

    def sse_event(self, error: ApiError) -> bytes:
        """The error as the last event of a stream that cannot go on."""
        named = b"event: " + self.event_name + b"\n" if self.event_name else b""
        return named + b"data: " + json.dumps(self.body(error)).encode() + b"\n\n"

    def response(self, error: ApiError) -> Response:
        body = json.dumps(self.body(error)).encode()
        return Response(body, status_code=error.status, media_type="application/json", headers=error.headers())

    def unauthorized(self) -> Response:
        response = self.response(ApiError(401, self.bad_key_message, code="invalid_api_key"))
        response.headers["www-authenticate"] = "Bearer"
        return response

    def engine_error(self, status: int, answer: Any, context_length: int) -> Response:
        """The engine refused a request: a too-long prompt in the dialect's canonical words (whatever
        the engine said), any other error as it came or its message reworded into the dialect."""
        if status >= 400 and (overflow := engine_overflow(answer, context_length)):
            return self.response(overflow)
        if self.relays_engine_errors and (whole := _openai_error(status, answer)) is not None:
            return JSONResponse(whole, status_code=status)
        error = answer.get("error") if isinstance(answer, dict) else None
        message = str(error.get("message") if isinstance(error, dict) else error or answer)
        return self.response(ApiError(status, message))


def _openai_error(status: int, answer: Any) -> dict[str, Any] | None:
    """An engine's OpenAI-shaped error with every field the shape has (``type``, ``param``, ``code``:
    some engines leave some out, and a client reads ``type``), the engine's own values kept; None when
    the answer has no ``{"error": {"message": …}}`` to keep."""
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return None
    filled = {"type": _TYPES.get(status, "invalid_request_error"), "param": None, "code": None}
    return {**answer, "error": filled | {key: value for key, value in error.items() if value is not None}}


_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}
_OVERFLOW = re.compile(
    r"maximum context length is (\d+) tokens\. However, (?:you requested|your messages resulted in) "
    r"(\d+ tokens|more tokens than that)"
)


def anthropic_message(message: str) -> str:
    """Context overflow worded as Anthropic's API words it, which Claude Code recognises ("prompt is too
    long: M tokens > N maximum") and answers by compacting; anything else unchanged."""
    if match := _OVERFLOW.search(message):
        maximum, tokens = match.groups()
        tokens = tokens if tokens[0].isdigit() else f"more than {maximum} tokens"
        return f"prompt is too long: {tokens} > {maximum} maximum"
    return message


def _anthropic_body(error: ApiError) -> dict[str, object]:
    kind = _ANTHROPIC_TYPES.get(error.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": anthropic_message(error.message)}}


OPENAI = ErrorShape(
    ApiError.body,
    "Incorrect API key provided: pass it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
    relays_engine_errors=True,
)
ANTHROPIC = ErrorShape(_anthropic_body, "invalid x-api-key", relays_engine_errors=False, event_name=b"error")


def shape_for(path: str) -> ErrorShape:
    """The dialect of a route: Anthropic's on the Messages API, OpenAI's everywhere else."""
    return ANTHROPIC if path.startswith("/v1/messages") else OPENAI

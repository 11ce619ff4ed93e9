"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Agents and SDKs read ``error.message`` and the status code; ``Retry-After`` tells their retry logic
how long to wait. Every error the gateway itself produces on an OpenAI route goes through here.
"""

from __future__ import annotations

import json

from starlette.responses import Response

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

    def response(self) -> Response:
        headers = self.headers()
        return Response(
            json.dumps(self.body()).encode(),
            status_code=self.status,
            media_type="application/json",
            headers=headers,
        )

    def sse_event(self) -> bytes:
        """The same error as a final server-sent event, for a stream that cannot continue."""
        return b"data: " + json.dumps(self.body()).encode() + b"\n\n"


def unavailable(message: str) -> ApiError:
    return ApiError(503, message, code="backend_unavailable", retry_after_s=RETRY_AFTER_S)

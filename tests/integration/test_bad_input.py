"""Bad requests get OpenAI-shaped 4xx errors from the gateway, never a 500 or a traceback."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.integration.conftest import BODY_LIMIT
from tests.integration.gatewayproc import GatewayProcess

pytestmark = pytest.mark.engine


def _assert_openai_error(response: httpx.Response, status: int, message_part: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert message_part in error["message"]
    assert "Traceback" not in response.text
    return dict(error)


def _post(gateway: GatewayProcess, path: str, content: bytes) -> httpx.Response:
    return httpx.post(gateway.url + path, content=content, headers={"Content-Type": "application/json"}, timeout=30)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_invalid_json(gateway: GatewayProcess, path: str) -> None:
    error = _assert_openai_error(_post(gateway, path, b'{"messages": [}'), 400, "not valid JSON")
    assert error["type"] == "invalid_request_error"


def test_a_body_that_is_not_an_object(gateway: GatewayProcess) -> None:
    _assert_openai_error(_post(gateway, "/v1/chat/completions", b"[1, 2]"), 400, "must be a JSON object")


def test_an_empty_body(gateway: GatewayProcess) -> None:
    _assert_openai_error(_post(gateway, "/v1/chat/completions", b""), 400, "empty")


def test_missing_messages(gateway: GatewayProcess) -> None:
    error = _assert_openai_error(
        _post(gateway, "/v1/chat/completions", b'{"model": "gemma-3-270m"}'), 400, "'messages'"
    )
    assert error["param"] == "messages"


def test_messages_of_the_wrong_type(gateway: GatewayProcess) -> None:
    _assert_openai_error(_post(gateway, "/v1/chat/completions", b'{"messages": "hi"}'), 400, "array")


def test_missing_prompt_on_completions(gateway: GatewayProcess) -> None:
    _assert_openai_error(_post(gateway, "/v1/completions", b'{"model": "gemma-3-270m"}'), 400, "'prompt'")


def test_oversized_body_is_413(gateway: GatewayProcess) -> None:
    huge = b'{"messages": [{"role": "user", "content": "' + b"x" * (BODY_LIMIT + 1) + b'"}]}'
    _assert_openai_error(_post(gateway, "/v1/chat/completions", huge), 413, "exceeds the limit")


def test_oversized_chunked_body_without_length_is_413(gateway: GatewayProcess) -> None:
    def chunks() -> Any:
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(BODY_LIMIT // 4096 + 2):
            yield b"x" * 4096
        yield b'"}]}'

    headers = {"Content-Type": "application/json"}
    response = httpx.post(gateway.url + "/v1/chat/completions", content=chunks(), headers=headers, timeout=30)
    _assert_openai_error(response, 413, "exceeds the limit")


def test_unknown_model_is_404_model_not_found(gateway: GatewayProcess) -> None:
    body = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}'
    error = _assert_openai_error(_post(gateway, "/v1/chat/completions", body), 404, "gpt-4o")
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "gemma-3-270m" in error["message"]


def test_unknown_route_and_wrong_method(gateway: GatewayProcess) -> None:
    _assert_openai_error(httpx.get(gateway.url + "/v1/nothing-here"), 404, "no route")
    _assert_openai_error(httpx.get(gateway.url + "/v1/chat/completions"), 405, "not allowed")


def test_missing_model(gateway: GatewayProcess) -> None:
    body = b'{"messages": [{"role": "user", "content": "hi"}]}'
    error = _assert_openai_error(_post(gateway, "/v1/chat/completions", body), 400, "'model'")
    assert error["param"] == "model" and "gemma-3-270m" in error["message"]

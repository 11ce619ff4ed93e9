"""The edge layers on their own: API keys (Bearer, x-api-key, a wrong key, /health open, the 401 in
the route's dialect) and request metrics (ids, counts, tokens)."""

from __future__ import annotations

import json
import re

import pytest
from prometheus_client import CollectorRegistry
from starlette.testclient import TestClient

from gateway.serving.edge.middleware import ApiKeys, Message, Receive, RequestMetrics, Scope, Send
from gateway.serving.wire import usage_tally
from gateway.serving.wire.request_id import request_id

KEY = "sk-right"
OPENAI_401 = {
    "error": {
        "message": "Incorrect API key provided: pass it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
        "type": "authentication_error",
        "param": None,
        "code": "invalid_api_key",
    }
}
ANTHROPIC_401 = {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}


async def _inner(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers 200 with a usage block (and the request id it saw), reporting it as a route behind the
    edge does (from the engine's parsed usage)."""
    if scope["type"] != "http":
        return
    body = {"usage": {"prompt_tokens": 3, "completion_tokens": 5}, "rid": request_id.get()}
    usage_tally.report(body["usage"])
    start: Message = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
    await send(start)
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


def _client(*keys: str) -> TestClient:
    return TestClient(ApiKeys(_inner, keys))


def test_without_keys_everything_is_open() -> None:
    client = _client()
    assert client.get("/v1/models").status_code == 200
    assert client.post("/v1/messages").status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": f"Bearer {KEY}"},
        {"Authorization": f"bearer {KEY}"},
        {"x-api-key": KEY},
        {"x-api-key": "sk-second"},
        {"x-api-key": "placeholder", "Authorization": f"Bearer {KEY}"},
        {"x-api-key": KEY, "Authorization": "Bearer placeholder"},
    ],
    ids=["bearer", "bearer-lowercase", "x-api-key", "second-key", "wrong-x-api-key-right-bearer", "the-reverse"],
)
def test_a_right_key_opens_every_route(headers: dict[str, str]) -> None:
    client = _client(KEY, "sk-second")
    for path in ("/v1/chat/completions", "/v1/messages", "/status", "/metrics"):
        assert client.post(path, headers=headers).status_code == 200, path


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer sk-wrong"}, {"x-api-key": "sk-wrong"}, {"Authorization": f"Basic {KEY}"},
     {"x-api-key": ""}, {"Authorization": f"Bearer {KEY}x"}],
    ids=["none", "wrong-bearer", "wrong-x-api-key", "not-bearer", "empty", "longer"],
)  # fmt: skip
def test_a_missing_or_wrong_key_is_401_in_openai_shape(headers: dict[str, str]) -> None:
    refused = _client(KEY, "").post("/v1/chat/completions", headers=headers)
    assert refused.status_code == 401
    assert refused.json() == OPENAI_401
    assert refused.headers["www-authenticate"] == "Bearer"
    assert refused.headers["content-type"] == "application/json"


def test_the_messages_routes_get_the_401_in_anthropic_shape() -> None:
    client = _client(KEY)
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        refused = client.post(path, headers={"x-api-key": "sk-wrong"})
        assert refused.status_code == 401 and refused.json() == ANTHROPIC_401, path


def test_health_readiness_and_the_root_stay_open_with_keys_set() -> None:
    client = _client(KEY)
    assert client.get("/health").status_code == 200
    assert client.get("/health", headers={"x-api-key": "sk-wrong"}).status_code == 200
    assert client.get("/ready").status_code == 200  # its detail is the route's to withhold (test_http_probes)
    assert client.head("/").status_code == 200
    assert client.get("/status").status_code == 401


def _metrics(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_request_ids_are_kept_or_made_and_visible_to_the_route() -> None:
    client = TestClient(RequestMetrics(_inner, CollectorRegistry()))
    given = client.get("/v1/models", headers={"x-request-id": "req-42"})
    assert given.headers["x-request-id"] == "req-42" and given.json()["rid"] == "req-42"
    made = client.get("/v1/models")
    assert re.fullmatch(r"[0-9a-f]{32}", made.headers["x-request-id"])
    assert made.json()["rid"] == made.headers["x-request-id"]
    odd = client.get("/v1/models", headers={"x-request-id": "réq-42".encode()})
    assert re.fullmatch(r"[0-9a-f]{32}", odd.headers["x-request-id"]), "a non-ASCII id is replaced, not mangled"


def test_requests_are_counted_by_route_and_status_with_their_tokens() -> None:
    registry = CollectorRegistry()
    client = TestClient(RequestMetrics(ApiKeys(_inner, [KEY]), registry, ["/v1/chat/completions"]))
    client.post("/v1/chat/completions", headers={"x-api-key": KEY})
    client.post("/v1/chat/completions")
    client.get("/somewhere/else", headers={"x-api-key": KEY})
    count = "gateway_requests_total"
    assert _metrics(registry, count, route="/v1/chat/completions", status="200") == 1
    assert _metrics(registry, count, route="/v1/chat/completions", status="401") == 1
    assert _metrics(registry, count, route="other", status="200") == 1
    assert _metrics(registry, "gateway_tokens_total", direction="in") == 6  # two 200s with usage
    assert _metrics(registry, "gateway_tokens_total", direction="out") == 10


def test_a_non_ascii_key_matches_what_a_utf8_client_sends() -> None:
    client = _client("clé-ü")
    sent = "clé-ü".encode()  # the bytes an SDK puts on the wire
    assert client.get("/v1/models", headers={"x-api-key": sent}).status_code == 200
    assert client.get("/v1/models", headers={"authorization": b"Bearer " + sent}).status_code == 200
    assert client.get("/v1/models", headers={"x-api-key": b"cl-"}).status_code == 401

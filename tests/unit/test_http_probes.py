"""What probes and operators see: readiness for anyone (detail behind the key), the root a client's
connectivity check hits, and one access-log line per request with its tokens."""

from __future__ import annotations

import json
import logging

import pytest
from starlette.testclient import TestClient

from gateway.serving.app import create_app
from tests.unit.http_harness import FRONTED, make_runtime

KEY = "sk-probe"


@pytest.mark.parametrize("ready", [True, False], ids=["ready", "starting"])
def test_readiness_answers_anyone_and_tells_detail_only_with_the_key(engine_url: str, ready: bool) -> None:
    with TestClient(create_app(make_runtime(engine_url, api_keys=(KEY,), ready=ready))) as client:
        bare = client.get("/ready")
        wrong = client.get("/ready", headers={"x-api-key": "sk-wrong"})
        keyed = client.get("/ready", headers={"Authorization": f"Bearer {KEY}"})
    status = 200 if ready else 503
    assert bare.status_code == wrong.status_code == keyed.status_code == status
    assert bare.json() == wrong.json() == {"status": "ready" if ready else "starting"}
    detail = {"model": FRONTED} if ready else {"reason": "loading the model"}
    assert keyed.json() == {**bare.json(), **detail}


def test_the_root_answers_a_connectivity_probe_without_a_key(engine_url: str) -> None:
    with TestClient(create_app(make_runtime(engine_url, api_keys=(KEY,)))) as client:
        head = client.head("/")
        models = client.get("/v1/models")
    assert head.status_code == 200 and head.content == b""
    assert models.status_code == 401


def test_each_request_gets_one_access_line_with_its_tokens(engine_url: str, caplog: pytest.LogCaptureFixture) -> None:
    body = {"model": FRONTED, "messages": [{"role": "user", "content": "hi"}]}
    with TestClient(create_app(make_runtime(engine_url))) as client, caplog.at_level(logging.INFO, "gateway.access"):
        client.post("/v1/chat/completions", json=body, headers={"x-request-id": "req-7", "user-agent": "agent/1"})
        streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
        client.post("/v1/chat/completions", json=streamed)
        client.post("/v1/chat/completions", json={**body, "stream": True})  # no usage asked: counts unknown
        client.get("/health")  # polled constantly: no line
        client.post("/v1/chat/completions", content=b"{", headers={"content-type": "application/json"})
    lines = [r for r in caplog.records if r.name == "gateway.access"]
    assert [(r.access["path"], r.access["status"]) for r in lines] == [  # type: ignore[attr-defined]
        ("/v1/chat/completions", 200), ("/v1/chat/completions", 200), ("/v1/chat/completions", 200),
        ("/v1/chat/completions", 400),
    ]  # fmt: skip
    first, stream = lines[0].access, lines[1].access  # type: ignore[attr-defined]
    assert (first["tokens_in"], first["tokens_out"], first["request_id"]) == (11, 7, "req-7")
    assert first["user_agent"] == "agent/1" and first["client"] and first["ms"] >= first["first_byte_ms"] >= 0
    assert (stream["tokens_in"], stream["tokens_out"]) == (11, 2)
    unknown = lines[2]
    assert (unknown.access["tokens_in"], unknown.access["tokens_out"]) == (None, None)  # type: ignore[attr-defined]
    assert "in=? out=?" in unknown.getMessage()
    assert "POST /v1/chat/completions 200" in lines[0].getMessage() and "in=11 out=7" in lines[0].getMessage()
    json.dumps(first)  # the JSON log format writes these fields as they are

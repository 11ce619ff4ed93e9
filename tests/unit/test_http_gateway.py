"""The HTTP app against an in-process stand-in engine: the translate path for both dialects (one reply
and streams), passthrough, the error each dialect gets for each failure, limits, readiness, metrics,
and the admission slot held and freed on every path (errors, finished streams, clients that leave)."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from gateway.serving.app import create_app
from gateway.serving.handlers import Inference
from gateway.serving.runtime import Runtime
from gateway.supervision.external import ExternalBackend
from tests.unit.http_harness import (
    ENGINE_CONTEXT,
    ENGINE_REFUSAL,
    FRONTED,
    PLANNED_CONTEXT,
    SERVED,
    FakeEngine,
    Served,
    make_runtime,
    sse_events,
    wait_until,
)

CHAT = {"model": FRONTED, "messages": [{"role": "user", "content": "hi there"}]}
RESPONSES = {"model": FRONTED, "input": "hi there"}
MESSAGES = {"model": "alias", "max_tokens": 2000, "messages": [{"role": "user", "content": "hi there"}]}
BODIES = {"/v1/chat/completions": CHAT, "/v1/responses": RESPONSES, "/v1/messages": MESSAGES}
PROMPT_TOKENS = 2 + 8  # "hi there" by the engine's tokenizer, plus the per-message overhead


def _anthropic(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _with_cue(path: str, cue: str, **extra: Any) -> dict[str, Any]:
    body = json.loads(json.dumps(BODIES[path]))
    if path == "/v1/responses":
        body["input"] = cue
    else:
        body["messages"][-1]["content"] = cue
    return {**body, **extra}


@contextmanager
def _gateway(runtime: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(runtime), raise_server_exceptions=False) as client:
        yield client
    assert (runtime.admission.active, runtime.admission.queued) == (0, 0), "an admission slot leaked"


# -- the translate path, both dialects ---------------------------------------------------------------
def test_responses_are_translated_to_chat_and_back(engine: FakeEngine, engine_url: str) -> None:
    with _gateway(make_runtime(engine_url)) as client:
        answer = client.post("/v1/responses", json=RESPONSES)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["object"] == "response" and body["status"] == "completed" and body["model"] == FRONTED
    assert body["output"][0]["content"][0]["text"] == "Hello world"
    [sent] = engine.requests_to("/v1/chat/completions")
    assert sent["body"]["model"] == SERVED and sent["body"]["stream"] is False
    assert sent["body"]["messages"] == [{"role": "user", "content": "hi there"}]


def test_responses_streams_are_translated_event_by_event(engine: FakeEngine, engine_url: str) -> None:
    with _gateway(make_runtime(engine_url)) as client:
        answer = client.post("/v1/responses", json={**RESPONSES, "stream": True})
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
    events = sse_events(answer.text)
    names = [name for name, _ in events]
    assert names[0] == "response.created" and names[-1] == "response.completed"
    text = "".join(data["delta"] for name, data in events if name == "response.output_text.delta")
    assert text == "Hello world"
    assert events[-1][1]["response"]["model"] == FRONTED
    [sent] = engine.requests_to("/v1/chat/completions")
    assert sent["body"]["stream"] is True and sent["body"]["model"] == SERVED


def test_messages_are_translated_to_chat_and_back(engine: FakeEngine, engine_url: str) -> None:
    with _gateway(make_runtime(engine_url)) as client:
        answer = client.post("/v1/messages", json=MESSAGES)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["type"] == "message" and body["model"] == FRONTED and body["stop_reason"] == "end_turn"
    assert body["content"] == [{"type": "text", "text": "Hello world", "citations": None}]
    assert (body["usage"]["input_tokens"], body["usage"]["output_tokens"]) == (11, 7)
    [sent] = engine.requests_to("/v1/chat/completions")
    assert sent["body"]["model"] == SERVED and sent["body"]["max_tokens"] == 2000
    assert engine.requests_to("/tokenize"), "a long max_tokens is checked against the prompt"


def test_messages_streams_are_translated_event_by_event(engine: FakeEngine, engine_url: str) -> None:
    with _gateway(make_runtime(engine_url)) as client:
        answer = client.post("/v1/messages", json={**MESSAGES, "stream": True})
    assert answer.status_code == 200, answer.text
    events = sse_events(answer.text)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    assert events[0][1]["message"]["usage"]["input_tokens"] == PROMPT_TOKENS
    assert events[0][1]["message"]["model"] == FRONTED
    text = "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta")
    assert text == "Hello world"
    delta = next(data for name, data in events if name == "message_delta")
    assert delta["delta"]["stop_reason"] == "end_turn"


def test_a_stream_without_engine_usage_gets_it_synthesized(engine: FakeEngine, engine_url: str) -> None:
    engine.sends_usage = False  # like llama-cpp-python, which ignores stream_options.include_usage
    with _gateway(make_runtime(engine_url, native=frozenset())) as client:
        answer = client.post("/v1/responses", json={**RESPONSES, "stream": True})
    final = sse_events(answer.text)[-1][1]["response"]
    assert final["usage"]["input_tokens"] == PROMPT_TOKENS  # counted by the engine's tokenizer
    assert engine.requests_to("/tokenize")


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/messages"])
def test_an_engine_that_speaks_the_api_gets_the_request_as_it_came(
    engine: FakeEngine, engine_url: str, path: str
) -> None:
    runtime = make_runtime(engine_url, native=frozenset({"responses", "messages", "include_usage"}))
    raw = json.dumps({**BODIES[path], "model": SERVED}).encode()
    with _gateway(runtime) as client:
        same = client.post(path, content=raw, headers={"content-type": "application/json"})
        renamed = client.post(path, json={**BODIES[path], "model": "ALIAS"})
    assert same.json() == {"engine_path": path, "model": FRONTED}  # the answer names the fronted model
    assert renamed.status_code == 200
    first, second = engine.requests_to(path)
    assert first["raw"] == raw  # byte for byte when nothing had to change
    assert second["body"]["model"] == SERVED
    assert not engine.requests_to("/v1/chat/completions")


def test_chat_completions_pass_through_renamed_and_completed(engine: FakeEngine, engine_url: str) -> None:
    with _gateway(make_runtime(engine_url)) as client:
        answer = client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "req-7"})
        stream = client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        text = client.post("/v1/completions", json={"model": FRONTED, "prompt": "hi"})
    body = answer.json()
    assert body["model"] == FRONTED and body["choices"][0]["logprobs"] is None
    assert body["choices"][0]["message"]["refusal"] is None
    chunks = [data for _, data in sse_events(stream.text)]
    assert chunks[-1] == "[DONE]" and all(chunk["model"] == FRONTED for chunk in chunks[:-1])
    assert text.json() == {"engine_path": "/v1/completions", "model": FRONTED}
    sent = engine.requests_to("/v1/chat/completions")[0]
    assert sent["headers"]["x-request-id"] == "req-7"
    assert sent["headers"]["authorization"] == "Bearer engine-key"


@pytest.mark.parametrize("keepalive", [False, True], ids=["own-connection", "pooled"])
def test_a_stream_gets_its_own_connection_unless_the_engine_keeps_them(
    engine: FakeEngine, engine_url: str, keepalive: bool
) -> None:
    """llama-server closes a connection after a stream without saying so; vLLM keeps it usable, and a
    fresh connection per stream costs the gateway CPU on every stream (benchmarks/proxy_overhead.py)."""
    native = frozenset({"include_usage", "stream_keepalive"} if keepalive else {"include_usage"})
    with _gateway(make_runtime(engine_url, native=native)) as client:
        client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        client.post("/v1/chat/completions", json=CHAT)
    stream_sent, plain_sent = engine.requests_to("/v1/chat/completions")
    assert (stream_sent["headers"].get("connection") == "close") is not keepalive
    assert plain_sent["headers"].get("connection") != "close"


def test_a_chat_stream_can_need_usage_and_a_rename_at_once(engine: FakeEngine, engine_url: str) -> None:
    engine.sends_usage = False
    wants_usage = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    with _gateway(make_runtime(engine_url, native=frozenset())) as client:
        stream = client.post("/v1/chat/completions", json=wants_usage)
    chunks = [data for _, data in sse_events(stream.text)]
    assert chunks[-1] == "[DONE]" and chunks[-2]["choices"] == []
    assert chunks[-2]["usage"]["prompt_tokens"] == PROMPT_TOKENS and chunks[-2]["model"] == FRONTED
    assert all(chunk["model"] == FRONTED for chunk in chunks[:-1])


def test_count_tokens_uses_the_engine_tokenizer(engine: FakeEngine, engine_url: str) -> None:
    with _gateway(make_runtime(engine_url)) as client:
        counted = client.post("/v1/messages/count_tokens", json=MESSAGES)
    assert counted.json() == {"input_tokens": PROMPT_TOKENS}


# -- errors, in the route's dialect ------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["reply", "stream"])
def test_an_engine_refusal_comes_back_in_the_dialect(engine: FakeEngine, engine_url: str, stream: bool) -> None:
    with _gateway(make_runtime(engine_url)) as client:
        openai = client.post("/v1/responses", json=_with_cue("/v1/responses", "REFUSE", stream=stream))
        anthropic = client.post("/v1/messages", json=_with_cue("/v1/messages", "REFUSE", stream=stream))
        chat = client.post("/v1/chat/completions", json=_with_cue("/v1/chat/completions", "REFUSE", stream=stream))
    canonical = {
        "error": {
            "message": "This model's maximum context length is 100 tokens. However, your messages resulted in 150 "
            "tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    assert canonical != ENGINE_REFUSAL  # the engine's own wording is replaced by OpenAI's
    assert openai.status_code == 400 and openai.json() == canonical
    assert anthropic.status_code == 400
    assert anthropic.json() == _anthropic("invalid_request_error", "prompt is too long: 150 tokens > 100 maximum")
    assert chat.status_code == 400 and chat.json() == canonical


def test_an_engine_answer_that_is_not_json_becomes_an_error_in_the_dialect(engine_url: str) -> None:
    with _gateway(make_runtime(engine_url)) as client:
        for stream in (False, True):
            openai = client.post("/v1/responses", json=_with_cue("/v1/responses", "NOTJSON", stream=stream))
            anthropic = client.post("/v1/messages", json=_with_cue("/v1/messages", "NOTJSON", stream=stream))
            # the page itself is not repeated: a proxy's error page can name the server's internal paths
            assert openai.status_code == 502 and "not JSON" in openai.json()["error"]["message"]
            assert "<html>" not in openai.text and "<html>" not in anthropic.text
            assert anthropic.status_code == 502 and anthropic.json()["error"]["type"] == "api_error"


@pytest.mark.parametrize("stream", [False, True], ids=["reply", "stream"])
def test_an_unreachable_engine_is_503_with_retry_after_in_the_dialect(stream: bool) -> None:
    runtime = make_runtime("http://127.0.0.1:9")
    with _gateway(runtime) as client:
        answers = {path: client.post(path, json={**body, "stream": stream}) for path, body in BODIES.items()}
    for path, answer in answers.items():
        assert answer.status_code == 503, path
        assert answer.headers["retry-after"] == "5" and answer.headers["retry-after-ms"] == "5000"
    assert answers["/v1/chat/completions"].json()["error"]["code"] == "backend_unavailable"
    assert answers["/v1/responses"].json()["error"]["type"] == "service_unavailable"
    assert answers["/v1/messages"].json()["error"]["type"] == "overloaded_error"


def test_the_gateway_own_errors_are_in_the_dialect(engine: FakeEngine, engine_url: str) -> None:
    with _gateway(make_runtime(engine_url)) as client:
        bad_json = {
            p: client.post(p, content=b'{"model": [}', headers={"content-type": "application/json"})
            for p in ("/v1/chat/completions", "/v1/messages")
        }
        no_max = client.post("/v1/messages", json={"model": FRONTED, "messages": MESSAGES["messages"]})
        no_input = client.post("/v1/responses", json={"model": FRONTED})
        unknown = {p: client.post(p, json={**BODIES[p], "model": "gpt-4o"}) for p in BODIES}
        no_route = client.get("/v1/nothing-here")
        methods = {p: client.get(p) for p in ("/v1/chat/completions", "/v1/messages")}
        empty = client.post("/v1/messages/count_tokens", json={"model": FRONTED, "messages": []})
    assert bad_json["/v1/chat/completions"].json()["error"]["code"] == "invalid_json"
    assert bad_json["/v1/messages"].status_code == 400
    assert bad_json["/v1/messages"].json()["error"]["type"] == "invalid_request_error"
    assert "not valid JSON" in bad_json["/v1/messages"].json()["error"]["message"]
    missing = "missing required parameter: 'max_tokens'"
    assert no_max.status_code == 400 and no_max.json() == _anthropic("invalid_request_error", missing)
    assert no_input.json()["error"]["param"] == "input"
    for path, answer in unknown.items():
        assert answer.status_code == 404, path
    assert unknown["/v1/chat/completions"].json()["error"]["code"] == "model_not_found"
    assert unknown["/v1/responses"].json()["error"]["code"] == "model_not_found"
    assert unknown["/v1/messages"].json()["error"]["type"] == "not_found_error"
    assert no_route.status_code == 404 and "no route GET /v1/nothing-here" in no_route.json()["error"]["message"]
    assert methods["/v1/chat/completions"].status_code == 405
    assert methods["/v1/chat/completions"].json()["error"]["message"].startswith("method GET is not allowed")
    assert methods["/v1/messages"].status_code == 405 and methods["/v1/messages"].json()["type"] == "error"
    assert empty.status_code == 400 and empty.json()["type"] == "error"
    assert engine.seen == []


def test_a_prompt_that_overflows_the_context_is_refused_before_the_engine(engine: FakeEngine, engine_url: str) -> None:
    """Only when the engine counted it exactly (its chat template, then its tokenizer)."""
    long = " ".join(["word"] * ENGINE_CONTEXT)
    with _gateway(make_runtime(engine_url, template_path="/apply-template")) as client:
        chat = client.post("/v1/chat/completions", json={**_with_cue("/v1/chat/completions", long), "max_tokens": 2000})
        anthropic = client.post("/v1/messages", json=_with_cue("/v1/messages", long))
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "context_length_exceeded"
    tokens = ENGINE_CONTEXT + 1  # the words and the role the template writes before them
    message = f"prompt is too long: {tokens} tokens > {ENGINE_CONTEXT} maximum"
    assert anthropic.status_code == 400 and anthropic.json() == _anthropic("invalid_request_error", message)
    assert not engine.requests_to("/v1/chat/completions")


def test_bodies_over_the_limit_are_413(engine: FakeEngine, engine_url: str) -> None:
    huge = json.dumps({**CHAT, "padding": "x" * 70_000}).encode()

    def chunked() -> Iterator[bytes]:
        yield huge[:40_000]
        yield huge[40_000:]

    with _gateway(make_runtime(engine_url, max_body_bytes=64 * 1024)) as client:
        declared = client.post("/v1/chat/completions", content=huge, headers={"content-type": "application/json"})
        streamed = client.post("/v1/chat/completions", content=chunked(), headers={"content-type": "application/json"})
        anthropic = client.post("/v1/messages", content=huge, headers={"content-type": "application/json"})
        fits = client.post("/v1/chat/completions", json=CHAT)
    assert declared.status_code == 413  # refused on its Content-Length, before reading it
    assert declared.json()["error"]["message"].startswith(f"request body of {len(huge)} bytes exceeds the limit")
    assert streamed.status_code == 413 and "exceeds the limit" in streamed.json()["error"]["message"]
    assert anthropic.status_code == 413 and anthropic.json()["error"]["type"] == "request_too_large"
    assert fits.status_code == 200
    assert len(engine.requests_to("/v1/chat/completions")) == 1


def test_an_unexpected_failure_is_500_in_the_dialect(engine_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(_self: Inference) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(Inference, "_target", broken)
    with _gateway(make_runtime(engine_url)) as client:
        chat = client.post("/v1/chat/completions", json=CHAT)
        anthropic = client.post("/v1/messages", json=MESSAGES)
    assert chat.status_code == 500 and "internal gateway error (RuntimeError)" in chat.json()["error"]["message"]
    assert anthropic.status_code == 500 and anthropic.json()["error"]["type"] == "api_error"


# -- readiness, models, status, metrics --------------------------------------------------------------
def test_a_backend_that_is_not_ready_is_503_everywhere_but_health(engine: FakeEngine, engine_url: str) -> None:
    with _gateway(make_runtime(engine_url, ready=False)) as client:
        health = client.get("/health")
        ready = client.get("/ready")
        chat = client.post("/v1/chat/completions", json=CHAT)
        anthropic = client.post("/v1/messages", json=MESSAGES)
        models = client.get("/v1/models").json()
        metrics = client.get("/metrics").text
    assert health.status_code == 200
    assert f"gateway_context_length {float(PLANNED_CONTEXT)}" in metrics, "/metrics and /v1/models disagree"
    assert ready.status_code == 503 and ready.json() == {"status": "starting", "reason": "loading the model"}
    assert ready.headers["retry-after"] == "5"
    assert chat.status_code == 503 and "is still starting" in chat.json()["error"]["message"]
    assert anthropic.status_code == 503 and anthropic.json()["error"]["type"] == "overloaded_error"
    assert {card["context_length"] for card in models["data"]} == {PLANNED_CONTEXT}
    assert engine.seen == []


def test_models_status_and_metrics_describe_the_live_engine(engine_url: str) -> None:
    with _gateway(make_runtime(engine_url, restarts=3)) as client:
        client.post("/v1/chat/completions", json=CHAT)
        ready = client.get("/ready").json()
        models = client.get("/v1/models").json()
        card = client.get("/v1/models/ALIAS").json()
        missing = client.get("/v1/models/other")
        status = client.get("/status").json()
        metrics = client.get("/metrics").text
    assert ready == {"status": "ready", "model": FRONTED}
    assert [m["id"] for m in models["data"]] == [FRONTED, "alias"]
    assert {m["context_length"] for m in models["data"]} == {ENGINE_CONTEXT}
    assert card["id"] == "ALIAS" and card["max_model_len"] == ENGINE_CONTEXT
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert status["model"] == FRONTED and status["context_length"] == ENGINE_CONTEXT and status["restarts"] == 3
    for line in (
        "gateway_backend_restarts 3.0",
        'gateway_backend_state{state="ready"} 1.0',
        'gateway_backend_state{state="starting"} 0.0',
        "gateway_active_requests 0.0",
        "gateway_queue_depth 0.0",
        "gateway_queue_rejections 0.0",
        f"gateway_context_length {float(ENGINE_CONTEXT)}",
        "gateway_plan_kv_tokens 12345.0",
        'gateway_plan_gpu_memory_bytes{gpu="0",term="weights"} 1000.0',
        'gateway_requests_total{route="/v1/chat/completions",status="200"} 1.0',
        'gateway_tokens_total{direction="in"} 11.0',
    ):
        assert line in metrics.splitlines(), line


def test_api_keys_guard_the_app(engine_url: str) -> None:
    with _gateway(make_runtime(engine_url, api_keys=("sk-1",))) as client:
        assert client.get("/health").status_code == 200
        assert client.get("/v1/models").status_code == 401
        assert client.post("/v1/messages", json=MESSAGES).json()["type"] == "error"
        assert client.get("/v1/models", headers={"Authorization": "Bearer sk-1"}).status_code == 200


def test_the_runtime_capacity_and_context_follow_the_launch(engine_url: str) -> None:
    runtime = make_runtime(engine_url, max_concurrency=7, ready=False)
    assert runtime.capacity() == 7 and runtime.context_length() == PLANNED_CONTEXT
    runtime = make_runtime(engine_url, max_concurrency=7)
    assert runtime.context_length() == ENGINE_CONTEXT and runtime.admission.capacity() == 7


# -- a slot is held while a stream runs, and freed when it ends ---------------------------------------
@contextmanager
def _live_gateway(runtime: Runtime) -> Iterator[httpx.Client]:
    server = Served(create_app(runtime))
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            yield client
    finally:
        server.stop()


@pytest.mark.parametrize("path", list(BODIES))
def test_a_stream_holds_its_slot_until_the_client_leaves(engine: FakeEngine, engine_url: str, path: str) -> None:
    runtime = make_runtime(engine_url, max_concurrency=1, queue_limit=0)
    with _live_gateway(runtime) as client:
        with client.stream("POST", path, json=_with_cue(path, "HANG", stream=True)) as hanging:
            assert hanging.status_code == 200
            chunks = hanging.iter_raw()  # kept: a dropped iterator closes the connection
            next(chunks)
            assert runtime.admission.active == 1
            busy = client.post(path, json=BODIES[path])
            assert busy.status_code == 429 and busy.headers["retry-after"] == "2"
            assert "gateway_queue_rejections 1.0" in client.get("/metrics").text.splitlines()
        wait_until(lambda: runtime.admission.active == 0, what="the slot to be freed")
        assert engine.disconnected.wait(5), "the engine was not told the client left"
        assert client.post(path, json=BODIES[path]).status_code == 200
    if path == "/v1/messages":
        assert busy.json()["error"]["type"] == "rate_limit_error" and busy.json()["type"] == "error"
    else:
        assert busy.json()["error"]["code"] == "rate_limit_exceeded"


def test_a_finished_stream_frees_its_slot_and_the_queue_moves(engine: FakeEngine, engine_url: str) -> None:
    runtime = make_runtime(engine_url, max_concurrency=1, queue_limit=4)
    with _live_gateway(runtime) as client:
        queued: list[httpx.Response] = []
        waiters = [
            threading.Thread(target=lambda: queued.append(client.post("/v1/responses", json=RESPONSES)))
            for _ in range(2)
        ]
        with client.stream("POST", "/v1/messages", json=_with_cue("/v1/messages", "HANG", stream=True)) as hanging:
            chunks = hanging.iter_raw()
            next(chunks)
            for waiter in waiters:
                waiter.start()
            wait_until(lambda: runtime.admission.queued == 2, what="two requests to queue")
            metrics = client.get("/metrics").text.splitlines()
            assert "gateway_queue_depth 2.0" in metrics and "gateway_active_requests 1.0" in metrics
        for waiter in waiters:
            waiter.join(10)
        assert [answer.status_code for answer in queued] == [200, 200]
        wait_until(lambda: runtime.admission.active == 0, what="the slot to be freed")
        done = client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert sse_events(done.text)[-1][1] == "[DONE]"
        assert runtime.admission.active == 0


def test_a_stream_flag_that_is_not_a_boolean_is_400_in_every_dialect(engine: FakeEngine, engine_url: str) -> None:
    """ "stream": "yes" used to stream on Messages and not on chat; now it is refused everywhere."""
    with _gateway(make_runtime(engine_url)) as client:
        answers = {p: client.post(p, json={**BODIES[p], "stream": "yes"}) for p in BODIES}
    for path, answer in answers.items():
        assert answer.status_code == 400, path
        assert "'stream' must be a boolean" in str(answer.json()), path
    assert answers["/v1/messages"].json()["type"] == "error"
    assert not engine.requests_to("/v1/chat/completions"), "a refused request reached the engine"


def test_a_200_that_is_not_a_chat_completion_is_502_in_the_dialect(engine: FakeEngine, engine_url: str) -> None:
    with _gateway(make_runtime(engine_url)) as client:
        answers = {p: client.post(p, json=_with_cue(p, "GARBAGE200")) for p in ("/v1/responses", "/v1/messages")}
    assert all(answer.status_code == 502 for answer in answers.values()), answers
    assert answers["/v1/messages"].json()["type"] == "error"
    assert "200 with a body that is not JSON" in answers["/v1/responses"].json()["error"]["message"]


def test_an_engines_retry_after_reaches_the_client(engine: FakeEngine, engine_url: str) -> None:
    with _gateway(make_runtime(engine_url)) as client:
        busy = client.post("/v1/chat/completions", json=_with_cue("/v1/chat/completions", "BUSY"))
    assert busy.status_code == 429 and busy.headers["retry-after"] == "7"


def test_a_backend_that_served_and_stopped_answering_is_not_called_starting(
    engine: FakeEngine, engine_url: str
) -> None:
    runtime = make_runtime(engine_url, ready=False)
    backend = runtime.backend
    backend.ever_ready, backend.reason = True, "the backend at http://x does not answer (ConnectError)"
    with _gateway(runtime) as client:
        chat = client.post("/v1/chat/completions", json=CHAT)
    message = chat.json()["error"]["message"]
    assert chat.status_code == 503 and "stopped answering" in message and "ConnectError" in message
    assert "still starting" not in message


def test_an_external_backend_that_never_answered_is_unreachable_not_starting() -> None:
    """A server the user runs (--backend-url) is not started by the gateway: while it does not answer,
    the 503 says so, with the reason from the last poll."""
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    runtime = make_runtime(f"http://127.0.0.1:{dead.getsockname()[1]}")
    launch = runtime.backend.target
    assert launch is not None
    backend = ExternalBackend(dataclasses.replace(launch, engine="external"))
    runtime.backend = backend
    try:
        with _gateway(runtime) as client:
            wait_until(lambda: backend.reason is not None and "does not answer" in backend.reason, what="a poll")
            chat = client.post("/v1/chat/completions", json=CHAT)
    finally:
        dead.close()
    message = chat.json()["error"]["message"]
    assert chat.status_code == 503 and "is unreachable" in message and "does not answer" in message, message
    assert "starting" not in message

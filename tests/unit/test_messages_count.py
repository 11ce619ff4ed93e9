"""A streamed Messages request translated for llama-server is not held back by the gateway's count of
its prompt: the count (the whole prompt rendered by /apply-template, then tokenized: two engine round
trips, ~110 ms of llama-server's CPU for a 20k-token Claude Code turn, benchmarks/messages_overhead.py)
runs beside the chat request, and message_start still says its figure."""

from __future__ import annotations

import httpx
from starlette.testclient import TestClient

from gateway.serving.app import create_app
from tests.unit.http_harness import FRONTED, FakeEngine, Served, make_runtime, sse_events
from tests.waiting import wait_until

NATIVE = frozenset({"include_usage"})  # llama-server: Messages translated by the gateway
BODY = {
    "model": FRONTED,
    "max_tokens": 16,
    "stream": True,
    "system": "You write code.",
    "messages": [{"role": "user", "content": "one two three"}],
}


def test_the_chat_request_reaches_the_engine_while_the_prompt_is_still_being_counted(
    engine: FakeEngine, engine_url: str
) -> None:
    engine.template_waits_for_chat = True  # its /apply-template answers once the chat request came
    with TestClient(create_app(make_runtime(engine_url, native=NATIVE, template_path="/apply-template"))) as client:
        answer = client.post("/v1/messages", json=BODY)
    assert answer.status_code == 200, answer.text
    assert engine.chat_came_before_template is True  # counted first, the chat would come 2 s later
    events = dict(sse_events(answer.text))
    counted = engine.requests_to("/tokenize")[-1]["body"]["input"]  # the rendered prompt the gateway counted
    assert events["message_start"]["message"]["usage"]["input_tokens"] == len(counted.split())
    assert events["message_stop"] == {"type": "message_stop"}


COUNT = {"model": FRONTED, "messages": [{"role": "user", "content": "one two three"}]}


def test_a_count_waits_its_turn_like_any_request_and_a_full_queue_refuses_it(
    engine: FakeEngine, engine_url: str
) -> None:
    """count_tokens reached the engine past a full queue (issue 47: 40 counts of 1 MB, 80 engine calls,
    while chat got 429). A count is two engine calls on llama-server: the chat rendered by
    /apply-template, then tokenized (no call does both)."""
    runtime = make_runtime(engine_url, native=NATIVE, template_path="/apply-template", max_concurrency=1, queue_limit=0)
    server = Served(create_app(runtime))
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            counted = client.post("/v1/messages/count_tokens", json=COUNT)
            assert counted.status_code == 200 and counted.json() == {"input_tokens": 4}, counted.text
            calls = [seen["path"] for seen in engine.seen]
            assert calls == ["/apply-template", "/tokenize"]
            hang = {**BODY, "messages": [{"role": "user", "content": "HANG"}]}
            with client.stream("POST", "/v1/messages", json=hang) as hanging:
                chunks = hanging.iter_raw()  # kept: a dropped iterator closes the connection
                next(chunks)
                wait_until(lambda: len(engine.seen) == 5, what="the stream's own count beside it")
                refused = [client.post("/v1/messages/count_tokens", json=COUNT) for _ in range(5)]
                assert [answer.status_code for answer in refused] == [429] * 5
                assert refused[0].json()["error"]["type"] == "rate_limit_error"
                assert len(engine.seen) == 5  # none reached the engine past the full queue
            wait_until(lambda: runtime.admission.active == 0, what="the slot to be freed")
    finally:
        server.stop()
    assert (runtime.admission.active, runtime.admission.queued) == (0, 0)

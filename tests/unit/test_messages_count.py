"""A streamed Messages request translated for llama-server is not held back by the gateway's count of
its prompt: the count (the whole prompt rendered by /apply-template, then tokenized: two engine round
trips, ~110 ms of llama-server's CPU for a 20k-token Claude Code turn, benchmarks/messages_overhead.py)
runs beside the chat request, and message_start still says its figure."""

from __future__ import annotations

from starlette.testclient import TestClient

from gateway.serving.app import create_app
from tests.unit.http_harness import FRONTED, FakeEngine, make_runtime, sse_events

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

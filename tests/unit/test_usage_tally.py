"""Token figures come from the engine's parsed usage, never from the response text (issue 41, item 3).

A translated Responses answer echoes the client's ``metadata`` after ``usage``; the access log and
``gateway_tokens_total`` were read with a regex over the body, so a client wrote its own figures (in=0
for a request that used 11/7, 10^15 counted, ``+Inf`` after two 309-digit numbers, a 400-digit one
aborting its own response). Here the same requests leave the engine's figures in the log and counters.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from starlette.testclient import TestClient

from gateway.serving.app import create_app
from gateway.serving.wire import usage_tally
from tests.unit.http_harness import FRONTED, FakeEngine, make_runtime

NATIVE = frozenset({"include_usage"})  # llama-server: Responses translated by the gateway
FORGED = [
    {"input_tokens": 0, "output_tokens": 0},
    {"prompt_tokens": 10**15, "completion_tokens": 10**15},
    {"prompt_tokens": 10**309},
    {"input_tokens": 10**400, "cached_tokens": 10**400},
]


def _access(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.access for r in caplog.records if r.name == "gateway.access"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_clients_metadata_never_reaches_the_counters_or_the_access_line(
    engine: FakeEngine, engine_url: str, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with TestClient(create_app(make_runtime(engine_url, native=NATIVE))) as client:
        with caplog.at_level(logging.INFO, "gateway.access"):
            for metadata in FORGED:
                body = {"model": FRONTED, "input": "hi", "stream": stream, "metadata": metadata}
                answer = client.post("/v1/responses", json=body)
                assert answer.status_code == 200 and answer.text.count("metadata") >= 1, answer.text[:300]
        metrics = client.get("/metrics").text
    out = 2 if stream else 7  # the fake engine's figures: 11 in, 7 out (2 streamed)
    assert [(a["tokens_in"], a["tokens_out"]) for a in _access(caplog)] == [(11, out)] * len(FORGED)
    assert f'gateway_tokens_total{{direction="in"}} {11.0 * len(FORGED)}' in metrics
    assert f'gateway_tokens_total{{direction="out"}} {float(out * len(FORGED))}' in metrics


def test_passthrough_reads_usage_where_engines_put_it_and_nowhere_else() -> None:
    """A native Responses stream (vLLM) also echoes metadata: only ``response.usage`` counts."""

    async def scenario() -> dict[str, int]:
        tally = {"in": 0, "out": 0, "cached": 0, "usage": 0}
        usage_tally.current.set(tally)
        tap = usage_tally.UsageTap()
        response = {"usage": {"input_tokens": 40, "output_tokens": 3, "input_tokens_details": {"cached_tokens": 32}}}
        response["metadata"] = {"usage": {"input_tokens": 0}, "input_tokens": 0, "output_tokens": 10**400}
        event = b"event: response.completed\ndata: " + json.dumps({"response": response}).encode() + b"\n\n"
        stream = b'event: response.output_text.delta\ndata: {"delta": "x"}\n\n' + event
        for start in range(0, len(stream), 7):  # a split across reads anywhere, "usage" included
            assert tap.feed(stream[start : start + 7]) == stream[start : start + 7]
        tap.flush()
        return tally

    assert asyncio.run(scenario()) == {"in": 40, "out": 3, "cached": 32, "usage": 1}


@pytest.mark.parametrize("bad", [-1, 10**400, 1e400, 2.5, True, "12", None, [3]])
def test_a_figure_that_is_not_a_sane_count_is_not_counted(bad: Any) -> None:
    assert usage_tally.figures({"prompt_tokens": bad, "completion_tokens": 4}) == {"in": 0, "out": 4, "cached": 0}
    assert usage_tally.figures({"prompt_tokens": bad}) is None


def test_an_engine_usage_of_ten_to_the_400_is_answered_and_not_counted(
    engine: FakeEngine, engine_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "_usage", lambda prompt, completion: {"prompt_tokens": 10**400, "completion_tokens": 7})
    with TestClient(create_app(make_runtime(engine_url, native=NATIVE))) as client:
        with caplog.at_level(logging.INFO, "gateway.access"):
            answers = [
                client.post(
                    "/v1/chat/completions", json={"model": FRONTED, "messages": [{"role": "user", "content": "hi"}]}
                ),
                client.post("/v1/responses", json={"model": FRONTED, "input": "hi"}),
                client.post(
                    "/v1/messages",
                    json={"model": FRONTED, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
                ),
            ]
        metrics = client.get("/metrics").text
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [(a["tokens_in"], a["tokens_out"]) for a in _access(caplog)] == [(0, 7)] * 3
    assert 'gateway_tokens_total{direction="out"} 21.0' in metrics
    assert not [line for line in metrics.splitlines() if line.startswith("gateway_tokens_total") and "Inf" in line]


def test_a_cached_count_above_the_prompt_is_never_reported() -> None:
    from gateway.serving.wire.usage import cached_tokens

    assert cached_tokens({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 50}}) == 10
    assert cached_tokens({"prompt_tokens_details": {"cached_tokens": 50}}) == 0  # no prompt said: no cached part
    assert usage_tally.figures({"prompt_tokens_details": {"cached_tokens": 50}}) == {"in": 0, "out": 0, "cached": 0}

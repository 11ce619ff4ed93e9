"""Streams in linear time and bounded memory (issue 41, item 2).

``EventBuffer.feed`` searched the rest of a read again for each event (15 MB of small events cost 8.6 s
of CPU in 256 KB reads, 0.25 s in 4 KB reads), and a streamed Responses translation held every delta it
had sent (300 MB of deltas: 1.27 GB of RSS). The bounds here are generous: each is many times what the
fixed code takes and many times less than what the old code took.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from gateway.serving.dialects import responses_api
from gateway.serving.dialects.responses_api import _Pieces
from gateway.serving.transport.proxy import EventAligned
from gateway.serving.wire.sse import EventBuffer, chat_chunks

EVENT = b'data: {"choices":[{"index":0,"delta":{"content":""}}]}\n\n'


def test_one_read_of_many_small_events_is_split_in_linear_time() -> None:
    """4 MB of 56-byte events in one read: ~75k events. Scanning the rest of the read for each (the old
    feed) is ~150 GB of memchr, minutes; once each, a few hundredths of a second."""
    block = EVENT * (4 * 1024 * 1024 // len(EVENT))
    started = time.process_time()
    events = EventBuffer().feed(block)
    assert len(events) == len(block) // len(EVENT) and events[-1] == EVENT
    assert time.process_time() - started < 2.0


def test_crlf_events_and_ends_split_across_reads_are_found_as_before() -> None:
    stream = b"data: 1\r\n\r\ndata: 2\n\ndata: 3\r\n\r\n" * 50 + b"data: last"
    for size in (1, 2, 3, 5, 64, len(stream)):
        buffer = EventBuffer()
        events = [event for start in range(0, len(stream), size) for event in buffer.feed(stream[start : start + size])]
        assert events == [b"data: 1\r\n\r\n", b"data: 2\n\n", b"data: 3\r\n\r\n"] * 50, size
        assert buffer.rest() == b"data: last"


def _chat(text_pieces: list[str]) -> AsyncIterator[bytes]:
    async def raw() -> AsyncIterator[bytes]:
        for piece in text_pieces:
            chunk = {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
            yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
        yield b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'

    return raw()


def _responses(pieces: list[str], max_held: int) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        stream = responses_api.stream_from_chat(chat_chunks(_chat(pieces)), {"input": "hi"}, "m", max_held)
        return [json.loads(block.split(b"data: ", 1)[1]) async for block in stream]

    return asyncio.run(run())


def test_a_streamed_responses_answer_past_the_cap_fails_instead_of_growing() -> None:
    events = _responses(["x" * 100] * 50, max_held=1000)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert len(deltas) == 10  # the 11th piece would pass 1,000 characters held
    assert events[-1]["type"] == "response.failed"
    assert "longer than the 1000 characters" in events[-1]["response"]["error"]["message"]
    assert len(json.dumps(events[-1])) < 2000  # the failure does not carry the text it refused to hold


def test_under_the_cap_the_done_events_carry_the_whole_text() -> None:
    events = _responses(["ab", "c"] * 5000, max_held=1 << 20)
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert done["text"] == "abc" * 5000 and events[-1]["type"] == "response.completed"


def test_held_pieces_are_joined_in_groups_and_read_back_in_order() -> None:
    pieces = _Pieces()
    for number in range(3 * _Pieces.GROUP + 5):
        pieces.add(str(number % 10))
    assert len(pieces.joined) == 3 and len(pieces.recent) == 5
    assert pieces.text() == "".join(str(n % 10) for n in range(3 * _Pieces.GROUP + 5))


def test_a_passed_through_stream_goes_on_in_whole_events_and_an_overlong_one_as_it_comes() -> None:
    aligned = EventAligned(max_held=64)
    assert aligned.feed(b"data: 1\n\ndata: 2") == b"data: 1\n\n"  # the half event waits
    assert aligned.feed(b"2\n\n") == b"data: 22\n\n"
    assert aligned.feed(b"data: 3\r\n\r\n") == b"data: 3\r\n\r\n"  # a read that ends an event: as it came
    assert aligned.feed(b"x" * 100) == b"x" * 100  # longer than max_held: not held
    assert aligned.feed(b"data: last") == b"" and aligned.flush() == b"data: last"

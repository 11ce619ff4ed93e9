"""What a translated stream must have seen to be reported as a success.

An engine that answers a stream request with chunks it should not send (``choices`` that is not a
list of objects) or that stops without a finish reason (it crashed, or a proxy cut it) was relayed as
a normal end: ``message_stop`` with ``stop_reason: "end_turn"`` and no content, or
``response.completed``, while the same request without streaming got a 502. So was one that stopped
after the finish reason but before ``data: [DONE]`` (the usage chunk comes between: its figures were
lost). These checks turn each into an ``{"error": …}`` chunk, which each translator words as its
dialect's error event.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from gateway.serving.wire.sse import DONE


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message}}


async def checked_chunks(chunks: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """The parsed chunks of a chat-completions stream, ending in an error chunk when the stream was
    malformed or did not finish."""
    finished = done = False
    async for chunk in chunks:
        done = chunk is DONE
        if isinstance(chunk, dict):
            if chunk.get("error"):
                yield chunk
                return
            choices = chunk.get("choices")
            if choices is not None and not (isinstance(choices, list) and all(isinstance(c, dict) for c in choices)):
                yield _error("the backend sent a malformed stream chunk ('choices' is not a list of objects)")
                return
            finished = finished or any(choice.get("finish_reason") for choice in choices or [])
        yield chunk
    if not finished:
        yield _error("the backend's stream ended without a finish reason (it stopped or was cut short)")
    elif not done:
        yield _error("the backend's stream ended without [DONE] (it stopped or was cut short)")

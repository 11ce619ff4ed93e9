"""A streamed chat completion read once, as typed events, for every dialect translated from it.

Why one reader: the Responses and Messages translators each walked the chat chunks themselves (errors,
the last usage, every choice's delta, tool calls gathered by index), with their state in closures, and
a fix to one walk missed the other. Here the walk is done once; a translator only says what each event
becomes in its dialect. The events come in the order the engine sent the pieces; the tool calls end,
in the order they started, when the stream does (a chat stream never says one call is complete), and
then :class:`Finish` — or one :class:`StreamError`, after which nothing comes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from gateway.serving.usage import cached_tokens, completion_tokens, prompt_tokens


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """What the model reasoned (``reasoning_content``, or ``reasoning`` as some engines name it)."""

    text: str


@dataclass(frozen=True)
class ToolCallStarted:
    index: int  # the chat stream's tool-call index, which the call's later pieces name
    call_id: str | None  # the engine's id; None when it gave none (each dialect words its own)
    name: str


@dataclass(frozen=True)
class ToolArgumentsDelta:
    index: int
    arguments: str  # a piece of the JSON arguments, not parseable on its own


@dataclass(frozen=True)
class ToolCallFinished:
    index: int
    call_id: str | None
    name: str
    arguments: str  # every piece, joined


@dataclass(frozen=True)
class Usage:
    """The engine's counts: the whole prompt (``cached`` of it reused from the prefix cache) and the output."""

    prompt: int = 0
    completion: int = 0
    cached: int = 0

    @classmethod
    def read(cls, usage: Any) -> Usage:
        return cls(prompt_tokens(usage), completion_tokens(usage), cached_tokens(usage))


@dataclass(frozen=True)
class Finish:
    reason: str | None  # the engine's last finish_reason ("stop", "length", "tool_calls", …)
    usage: Usage  # from the last chunk that carried usage (the include_usage chunk comes after the finish)


@dataclass(frozen=True)
class StreamError:
    message: str  # the engine's (or the proxy's) words, for the translator to put in its dialect


ChatEvent = TextDelta | ReasoningDelta | ToolCallStarted | ToolArgumentsDelta | ToolCallFinished | Finish | StreamError


async def read_chat_stream(chunks: AsyncIterator[dict[str, Any] | object]) -> AsyncIterator[ChatEvent]:
    """The events of parsed chat chunks (``sse.chat_chunks``; anything not a dict, like DONE, is skipped).
    Every choice's delta is read as one answer, as the agents' single-choice requests get."""
    started: dict[int, ToolCallStarted] = {}
    arguments: dict[int, list[str]] = {}  # pieces, joined once at the end (a file written by a tool is thousands)
    usage: Any = None
    reason: str | None = None
    async for chunk in chunks:
        if not isinstance(chunk, dict):
            continue
        if error := chunk.get("error"):
            yield StreamError(str(error.get("message", error) if isinstance(error, dict) else error))
            return
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            reason = choice.get("finish_reason") or reason
            if thought := delta.get("reasoning_content") or delta.get("reasoning"):
                yield ReasoningDelta(thought)
            if delta.get("content"):
                yield TextDelta(delta["content"])
            for call in delta.get("tool_calls") or []:
                index, function = int(call.get("index", 0)), call.get("function") or {}
                if index not in started:
                    started[index] = ToolCallStarted(index, call.get("id") or None, function.get("name") or "")
                    arguments[index] = []
                    yield started[index]
                if piece := function.get("arguments"):
                    arguments[index].append(piece)
                    yield ToolArgumentsDelta(index, piece)
    for index, call in started.items():
        yield ToolCallFinished(index, call.call_id, call.name, "".join(arguments[index]))
    yield Finish(reason, Usage.read(usage))

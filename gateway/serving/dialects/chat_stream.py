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

from gateway.serving.wire.usage import cached_tokens, completion_tokens, prompt_tokens


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
    """The call's end; its arguments came in its deltas (not held here: a translator that needs them
    whole keeps them, with its own cap)."""

    index: int
    call_id: str | None
    name: str


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
    Every choice's delta is read as one answer, as the agents' single-choice requests get. A chunk the
    engine shaped wrongly (``choices`` not a list of objects, a delta or text that is not what the
    schema says) ends the stream with a :class:`StreamError` rather than an exception mid-stream."""
    started: dict[int, ToolCallStarted] = {}
    usage: Any = None
    reason: str | None = None
    async for chunk in chunks:
        if not isinstance(chunk, dict):
            continue
        if error := chunk.get("error"):
            yield StreamError(str(error.get("message", error) if isinstance(error, dict) else error))
            return
        usage = chunk.get("usage") or usage
        choices = chunk.get("choices") or []
        if not isinstance(choices, list) or not all(isinstance(choice, dict) for choice in choices):
            yield StreamError(_malformed("'choices' is not a list of objects"))
            return
        for choice in choices:
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                yield StreamError(_malformed("a delta is not an object"))
                return
            finish = choice.get("finish_reason")
            reason = finish if isinstance(finish, str) and finish else reason
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            content = delta.get("content")
            calls = delta.get("tool_calls") or []
            if not _text(thought) or not _text(content) or not isinstance(calls, list):
                yield StreamError(_malformed("a delta's text or tool calls have the wrong type"))
                return
            if thought:
                yield ReasoningDelta(thought)
            if content:
                yield TextDelta(content)
            for call in calls:
                if (parts := _call_parts(call)) is None:
                    yield StreamError(_malformed("a tool call's index, id, name or arguments have the wrong type"))
                    return
                index, call_id, name, piece = parts
                if index not in started:
                    started[index] = ToolCallStarted(index, call_id, name)
                    yield started[index]
                if piece:
                    yield ToolArgumentsDelta(index, piece)
    for index, call in started.items():
        yield ToolCallFinished(index, call.call_id, call.name)
    yield Finish(reason, Usage.read(usage))


MAX_TOOL_CALLS = 4096  # tool-call indexes in one answer (agents' answers make a handful)


def _call_parts(call: Any) -> tuple[int, str | None, str, str] | None:
    """(index, id, name, arguments piece) of one tool-call delta, or None when its types are wrong."""
    if not isinstance(call, dict):
        return None
    index, function = call.get("index", 0), call.get("function") or {}
    if not (isinstance(index, int) and not isinstance(index, bool) and 0 <= index < MAX_TOOL_CALLS):
        return None
    if not isinstance(function, dict):
        return None
    call_id, name, piece = call.get("id"), function.get("name"), function.get("arguments")
    if not (_text(call_id) and _text(name) and _text(piece)):
        return None
    return index, call_id or None, name or "", piece or ""


def _text(value: Any) -> bool:
    """Absent or a string: what the chat schema allows for a delta's text, a name or arguments."""
    return value is None or isinstance(value, str)


def _malformed(what: str) -> str:
    return f"the backend sent a malformed chat chunk ({what})"

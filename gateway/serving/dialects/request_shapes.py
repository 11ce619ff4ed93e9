"""The shapes of request bodies, as far as the gateway reads them, checked once at the edge.

Each model declares only the fields the gateway itself looks at (to route, count, flatten or
translate); every other field is allowed and passed through untouched, for the engine to judge.
Validation is strict (no coercion: ``"stream": "yes"`` is not a boolean) and only validates: the
payload forwarded is the client's own, never the model's dump. A mismatch is a 400 that names the
field, written in the route's dialect by the caller's error handler.

What a request holds many of (messages, content blocks, tools) is a TypedDict, not a model: a body
may carry 99,000 of them, and building as many model objects (a recursive one for the tools) held the
event loop 0.8-1.5 s where checking them as dicts takes 0.08 s.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from typing_extensions import TypedDict  # pydantic reads only this TypedDict before Python 3.12

from gateway.serving.wire.error_shapes import ApiError


class _Shape(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


_ITEM = ConfigDict(extra="ignore", strict=True)  # the other keys pass through in the payload all the same


class _Request(_Shape):
    model: str | None = None  # its absence is reported with the served name (handlers)
    stream: bool | None = None


# -- chat and text completions ---------------------------------------------------------------------
class ChatMessage(TypedDict, total=False):
    """Read when the prompt is flattened to count its tokens."""

    __pydantic_config__ = _ITEM  # type: ignore[misc]
    content: str | list[Any] | None
    tool_calls: list[Any] | None


class _OpenAIRequest(_Request):
    tools: list[Any] | None = None
    stream_options: dict[str, Any] | None = None


class ChatCompletionRequest(_OpenAIRequest):
    messages: list[ChatMessage] = Field(min_length=1)


class CompletionRequest(_OpenAIRequest):
    prompt: str | list[Any]
    messages: list[ChatMessage] | None = None  # not OpenAI's, but flattened with the prompt when present


# -- Anthropic Messages ---------------------------------------------------------------------------------
class ContentBlock(TypedDict, total=False):
    """A content or system block: its text is joined into the chat prompt."""

    __pydantic_config__ = _ITEM  # type: ignore[misc]
    type: str | None
    text: str


class AnthropicMessage(TypedDict):
    __pydantic_config__ = _ITEM  # type: ignore[misc]
    # "system" inside messages: Claude Code sends one mid-conversation (beta mid-conversation-system)
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class CountTokensRequest(_Request):
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[ContentBlock] | None = None
    tools: list[Any] | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int


# -- OpenAI Responses -------------------------------------------------------------------------------
class ResponsesTool(TypedDict):
    """A tool, or a Codex ``namespace`` of tools flattened into function tools."""

    __pydantic_config__ = _ITEM  # type: ignore[misc]
    type: NotRequired[str | None]
    tools: NotRequired[list[ResponsesTool]]


class ResponsesRequest(_Request):
    input: str | list[dict[str, Any]]
    tools: list[ResponsesTool] | None = None


_WHAT = {
    "string_type": "a string",
    "bool_type": "a boolean (true or false)",
    "int_type": "an integer",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
}


def check(shape: type[BaseModel], payload: dict[str, Any]) -> None:
    """Raise a 400 naming the first field of ``payload`` that does not fit ``shape``."""
    try:
        shape.model_validate(payload)
    except ValidationError as exc:
        raise _as_api_error(exc) from None


def _as_api_error(exc: ValidationError) -> ApiError:
    """The first problem, worded for a client: the field's path, and what it must be (every branch
    of a union: "'input' must be a string or an array"; the deepest field when one branch got further)."""
    errors = exc.errors(include_url=False)
    errors.sort(key=lambda e: -len(_field(e["loc"]).split(".")))  # the branch that got furthest first
    field = _field(errors[0]["loc"])
    if errors[0]["type"] == "missing":
        return ApiError(400, f"missing required parameter: '{field}'", param=field, code="missing_required_parameter")
    if errors[0]["type"] == "too_short":
        return ApiError(400, f"'{field}' must contain at least one element", param=field, code="invalid_value")
    kinds = [_WHAT[e["type"]] for e in errors if _field(e["loc"]) == field and e["type"] in _WHAT]
    if kinds:
        return ApiError(400, f"'{field}' must be {' or '.join(dict.fromkeys(kinds))}", param=field, code="invalid_type")
    return ApiError(400, f"'{field}': {errors[0]['msg']}", param=field, code="invalid_value")


def _field(loc: tuple[int | str, ...]) -> str:
    """A field's path as a client wrote it: pydantic's union branch names (``str``, ``list[...]``,
    ``ContentBlock``) left out."""
    parts = [str(part) for part in loc if isinstance(part, int) or not _is_branch(part)]
    return ".".join(parts) or "body"


def _is_branch(part: str) -> bool:
    return part in ("str", "int", "bool") or "[" in part or part[:1].isupper()

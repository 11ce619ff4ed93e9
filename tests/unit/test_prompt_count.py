"""The prompt is counted in one place, once a request: every step that needs the figure (the output's fit,
the usage chunk an engine will not send, message_start) gets the first answer, an engine that cannot
count included (it was asked again by each step)."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.backends.base import Launch
from gateway.serving.transport.prompt_count import PER_MESSAGE_OVERHEAD, PromptCount

CHAT = {"messages": [{"role": "user", "content": "one two three"}], "tools": [{"type": "function"}]}


class Engine:
    """Answers the gateway's posts as the tokenizer would (or with ``status``), and counts them."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.posts: list[str] = []

    async def post_json(self, _target: Launch, path: str, payload: dict[str, Any]) -> tuple[int, Any]:
        self.posts.append(path)
        if path == "/apply-template":
            return self.status, {"prompt": "rendered: one two three"}
        return self.status, {"count": len(str(payload.get("content", "")).split())}


def _target(template_path: str | None = None) -> Launch:
    return Launch(
        engine="fake", argv=[], port=0, api_key="k", served_name="m", context_length=4096,
        health_path="/health", summary="", tokenize_path="/tokenize", tokenize_key="content",
        template_path=template_path,
    )  # fmt: skip


def _asked_three_times(engine: Engine, target: Launch) -> list[tuple[int, bool] | None]:
    prompt = PromptCount(engine, target, CHAT)  # type: ignore[arg-type]

    async def steps() -> list[tuple[int, bool] | None]:
        return [await prompt.counted() for _ in range(3)]

    return asyncio.run(steps())


def test_an_exact_count_is_asked_of_the_engine_once() -> None:
    engine = Engine()
    assert _asked_three_times(engine, _target("/apply-template")) == [(4, True)] * 3
    assert engine.posts == ["/apply-template", "/tokenize"]


def test_an_estimate_adds_the_per_message_allowance() -> None:
    engine = Engine()
    counted = _asked_three_times(engine, _target())[0]
    assert counted is not None and counted[1] is False and counted[0] > PER_MESSAGE_OVERHEAD
    assert engine.posts == ["/tokenize"]


def test_an_engine_that_cannot_count_is_not_asked_again() -> None:
    engine = Engine(status=404)
    assert _asked_three_times(engine, _target("/apply-template")) == [None] * 3
    assert engine.posts == ["/apply-template", "/tokenize"]  # the template failed: then the flattened text

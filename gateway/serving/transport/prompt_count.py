"""A request's prompt tokens as the engine counts them: the one counter, asked at most once a request.

Three steps of a request want the figure (fitting a long requested output beside the prompt, the
usage chunk an engine that ignores ``include_usage`` will not send, and Messages' ``message_start``),
and each asked the engine again: two round trips that render and tokenize the whole prompt, every
time. :class:`PromptCount` asks once and hands the same answer to each.

Exact when the engine renders the chat with its own template (tools included, as the template renders
them) and tokenizes that; otherwise the flattened text through its tokenizer plus a per-message
allowance, an estimate that must never decide a refusal.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.serving.transport.proxy import EngineClient
from gateway.supervision.lifecycle import EngineTarget

PER_MESSAGE_OVERHEAD = 8  # chat-template tokens around each message, roughly


class PromptCount:
    """One request's prompt, counted by the engine on first ask; later asks get the same answer."""

    def __init__(self, client: EngineClient, target: EngineTarget, request: dict[str, Any]) -> None:
        self.client, self.target, self.request = client, target, request
        self._asked = False
        self._counted: tuple[int, bool] | None = None

    async def counted(self) -> tuple[int, bool] | None:
        """(prompt tokens, exact), or None when the engine cannot count. The request is read when first
        asked: what the gateway changed in it by then (the model's name, the output's length) is counted."""
        if not self._asked:
            self._counted = await count_prompt(self.client, self.target, self.request)
            self._asked = True
        return self._counted

    def follow(self, client: EngineClient, target: EngineTarget) -> None:
        """The request goes to another replica than the one it was placed on (that one failed): a count
        not asked yet is asked there."""
        if not self._asked:
            self.client, self.target = client, target

    async def tokens(self) -> int | None:
        counted = await self.counted()
        return None if counted is None else counted[0]


async def count_prompt(client: EngineClient, target: EngineTarget, request: dict[str, Any]) -> tuple[int, bool] | None:
    """(prompt tokens, exact) of a chat or completion request, or None when the engine cannot count."""
    messages = request.get("messages")
    if isinstance(messages, list) and messages and (target.tokenize_chat or target.template_path):
        chat = {key: request[key] for key in ("messages", "tools") if request.get(key)}
        if target.tokenize_chat and target.tokenize_path:
            status, body = await client.post_json(
                target, target.tokenize_path, {"model": target.served_name, **chat, "add_generation_prompt": True}
            )
            if status == 200 and isinstance(body, dict) and isinstance(body.get("count"), int):
                return int(body["count"]), True
        elif target.template_path:
            status, body = await client.post_json(target, target.template_path, chat)
            if status == 200 and isinstance(body, dict) and isinstance(body.get("prompt"), str):
                counted = await _count_text(client, target, body["prompt"])
                if counted is not None:
                    return counted, True
    text, count = flatten_prompt(request)
    estimated = await _count_text(client, target, text)
    return None if estimated is None else (estimated + PER_MESSAGE_OVERHEAD * count, False)


async def _count_text(client: EngineClient, target: EngineTarget, text: str) -> int | None:
    """The engine's own token count for ``text`` (None when it has no tokenizer endpoint)."""
    if not target.tokenize_path:
        return None
    payload = {target.tokenize_key: text, "model": target.served_name}
    status, body = await client.post_json(target, target.tokenize_path, payload)
    if status != 200 or not isinstance(body, dict):
        return None
    count = body.get("count")
    return int(count) if isinstance(count, int) else len(body.get("tokens") or [])


def flatten_prompt(payload: dict[str, Any]) -> tuple[str, int]:
    """(text of every message and tool schema, number of messages) for counting prompt tokens."""
    parts: list[str] = []
    messages = payload.get("messages") or []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [str(p.get("text", "")) for p in content if isinstance(p, dict)]
        for call in (message.get("tool_calls") or []) if isinstance(message, dict) else []:
            parts.append(json.dumps(call))
    parts += [json.dumps(tool) for tool in payload.get("tools") or []]
    if isinstance(payload.get("prompt"), str):
        parts.append(payload["prompt"])
    return "\n".join(parts), len(messages)

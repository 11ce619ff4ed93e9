"""Keeping a conversation's prompt prefix byte-stable from one request to the next, so that the
engine's prefix cache (llama-server's slot and host-RAM caches, vLLM's prefix caching) holds.

Claude Code opens its system prompt with an attribution line,
``x-anthropic-billing-header: cc_version=2.1.197.d42; cc_entrypoint=sdk-cli;`` (releases 2.1.36-2.1.177
add ``cch=<hash>``, new on every request: anthropics/claude-code#68900). Its suffix changes between
conversations and side requests, so the system prompt and tools that every conversation shares (20-30k
tokens) were prefilled again from that first line. Anthropic's own API lifts the line out before the
model sees it; the gateway does the same (as vLLM does since vllm-project/vllm#36829), on every route,
before the request is passed through or translated. Only that line goes: a block or message that held
nothing else goes with it (as if the client had not sent it, ``CLAUDE_CODE_ATTRIBUTION_HEADER=0``),
and every other byte of the prompt stays as the client wrote it.
"""

from __future__ import annotations

import re
from typing import Any

# the whole line and its line break, wherever it stands in a system text (first block, or inside a
# string): a line ends at any break str.splitlines knows (a CR alone or U+2028 ended it only at the next
# \n, and the rest of the system prompt went with it)
_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
BILLING_LINE = re.compile(rf"(?:^|(?<=[{_BREAKS}]))x-anthropic-billing-header:[^{_BREAKS}]*(?:\r\n|[{_BREAKS}]|\Z)")
_MARK = "x-anthropic-billing-header:"
_SYSTEM_ROLES = ("system", "developer")


def _text(text: str) -> str:
    return BILLING_LINE.sub("", text) if _MARK in text else text


def _content(content: Any) -> tuple[Any, bool]:
    """System content (a string or a list of text blocks/parts) without the billing line: (content, changed)."""
    if isinstance(content, str):
        stripped = _text(content)
        return stripped, stripped != content
    if not isinstance(content, list):
        return content, False
    kept: list[Any] = []
    changed = False
    for block in content:
        text = block.get("text") if isinstance(block, dict) else None
        if not isinstance(text, str) or _MARK not in text:
            kept.append(block)
            continue
        changed = True
        if stripped := _text(text):
            kept.append({**block, "text": stripped})
    return kept, changed


def _system_messages(messages: Any) -> bool:
    """Strip the line from every system/developer message of a list (chat messages, Messages' mid-conversation
    system, Responses' input items); a message left empty is dropped. True when the list changed."""
    if not isinstance(messages, list):
        return False
    changed = False
    for index in reversed(range(len(messages))):
        message = messages[index]
        if not isinstance(message, dict) or message.get("role") not in _SYSTEM_ROLES:
            continue
        content, stripped = _content(message.get("content"))
        if not stripped:
            continue
        changed = True
        if content or len(messages) == 1:  # the only message stays, empty: engines refuse ``messages: []``
            messages[index] = {**message, "content": content}
        else:
            del messages[index]
    return changed


def _field(payload: dict[str, Any], key: str) -> bool:
    """Strip the line from a top-level system field (Messages' ``system``, Responses' ``instructions``);
    a field left empty is removed."""
    if key not in payload:
        return False
    content, changed = _content(payload[key])
    if changed:
        if content:
            payload[key] = content
        else:
            del payload[key]
    return changed


def strip_billing_header(payload: dict[str, Any]) -> bool:
    """Remove Claude Code's billing line from a chat, Messages or Responses request, in place: from
    ``system`` and ``instructions``, and from system/developer messages in ``messages`` or ``input``.
    True when the payload changed (it must then be re-encoded before it is forwarded)."""
    changed = _field(payload, "system")
    changed |= _field(payload, "instructions")
    changed |= _system_messages(payload.get("messages"))
    changed |= _system_messages(payload.get("input"))
    return changed

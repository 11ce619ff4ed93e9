"""The engine's usage figures, read one way for every dialect the gateway answers in.

Both engines say how much of a prompt came from their prefix cache in OpenAI's own field,
``usage.prompt_tokens_details.cached_tokens`` (llama-server always; vLLM with
``--enable-prompt-tokens-details``, which its launch sets). ``prompt_tokens`` is the whole prompt,
cached part included; each dialect then reports the cached part in its own field.
"""

from __future__ import annotations

from typing import Any


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def prompt_tokens(usage: Any) -> int:
    return _count(usage.get("prompt_tokens")) if isinstance(usage, dict) else 0


def completion_tokens(usage: Any) -> int:
    return _count(usage.get("completion_tokens")) if isinstance(usage, dict) else 0


def cached_tokens(usage: Any) -> int:
    """The prompt tokens the engine reused from its cache (0 when it did not say), never more than the prompt."""
    if not isinstance(usage, dict):
        return 0
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    total = prompt_tokens(usage)
    return min(cached, total) if total else cached

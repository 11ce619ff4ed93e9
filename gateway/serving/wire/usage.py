"""The engine's usage figures, read one way for every dialect the gateway answers in.

Both engines say how much of a prompt came from their prefix cache in OpenAI's own field,
``usage.prompt_tokens_details.cached_tokens`` (llama-server always; vLLM with
``--enable-prompt-tokens-details``, which its launch sets). ``prompt_tokens`` is the whole prompt,
cached part included; each dialect then reports the cached part in its own field.
"""

from __future__ import annotations

from typing import Any

MAX_TOKENS = 100_000_000  # one figure of one request: far above any context window, far below a float's reach


def count(value: Any) -> int | None:
    """A token figure when it is one (an int in [0, MAX_TOKENS]); None for anything else (an engine's
    ``1e400`` or 400-digit number is not relayed, summed or logged)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS:
        return value
    return None


def _count(value: Any) -> int:
    return count(value) or 0


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
    return min(cached, prompt_tokens(usage))  # a prompt the engine did not count has no cached part either

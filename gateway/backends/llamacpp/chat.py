"""How llama-server applies a GGUF's own chat template: ``--jinja`` (tool calls parsed from the
template's format) and, for a model that thinks, ``--reasoning-format deepseek`` so the thinking
lands in ``reasoning_content`` instead of ``content``."""

from __future__ import annotations

# what a thinking model's template writes around its reasoning (Qwen3, GLM, DeepSeek: <think>;
# gpt-oss: the harmony analysis channel; Granite: <think> as well)
THINKING_MARKERS = ("<think>", "<|channel|>", "<seed:think>")


def reasoning_format(template: str | None) -> str | None:
    """``deepseek`` (llama-server's name for "thinking into reasoning_content") when the template
    shows a thinking model; None otherwise (nothing to split)."""
    if template and any(marker in template for marker in THINKING_MARKERS):
        return "deepseek"
    return None


def has_tools(template: str | None) -> bool:
    """Whether the template renders the request's tools (otherwise a tool call cannot be asked for)."""
    return bool(template) and "tools" in str(template)

